"""A refusal is not a crash: no traceback in the hub's log for a spawn gpupool refused.

JupyterHub logs any error of the spawn form's options with its traceback ("Failed to spawn
single-user server with form"), so a GPU-hour budget used up or a quota full read in the log like
a bug. gpupool's spawner already logs each refusal as one warning line ("refused ...: why"); this
filter keeps JupyterHub's line and drops the traceback of exactly those refusals (the 4xx errors
gpupool's spawner raises, marked REFUSAL). Any other error keeps its traceback.
"""

from __future__ import annotations

import logging

REFUSAL = "gpupool_refusal"  # set on the HTTPError a gpupool refusal is raised as


class QuietRefusals(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        err = record.exc_info[1] if record.exc_info else None
        if err is not None and getattr(err, REFUSAL, False):
            said = getattr(err, "jupyterhub_message", "") or str(err)
            record.msg = f"{record.getMessage()}: refused: {said}"
            record.args, record.exc_info, record.exc_text = None, None, None
        return True


def install(logger: logging.Logger) -> None:
    """On the hub's own logger (once): JupyterHub's handlers log the spawn form's errors there."""
    if not any(isinstance(f, QuietRefusals) for f in logger.filters):
        logger.addFilter(QuietRefusals())
