"""What gpupool does when the hub begins to stop (SIGTERM, Ctrl-C): from the first signal nothing
new starts (spawns are refused, the train scheduler admits no job), and the log says, step by step,
what ends and what keeps running.

Without it a stopping hub went on scheduling while JupyterHub stopped its servers: the GPUs a
stopped server gave back went to a queued job seconds after the signal, which then ran on with no
hub counting it.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from gpupool.wiring.root import GPUPoolHub

log = logging.getLogger("gpupool")
WHY = "the hub is stopping: nothing new starts until it is started again"


def at_stop(root: GPUPoolHub, sig: str) -> list[str]:
    """The first thing a stop does (gpupool.hub.adapter.HubApp.on_stop). Returns the lines logged."""
    root.pool.stopping = WHY
    lines = [f"stopping ({sig}): no server or train job starts from now"]
    running = root.running
    training = running.api.training if running is not None else None
    engine = training.local if training is not None else None
    if engine is not None:
        lines += engine.at_stop(engine.cfg.stop_jobs_at_stop)
    lines.append(
        "JupyterHub now stops its services (the idle culler), then the servers"
        " (c.JupyterHub.cleanup_servers) and the proxy"
    )
    for line in lines:
        log.warning("gpupool: %s", line)
    return lines
