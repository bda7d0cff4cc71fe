"""A train job's code as data: the files snapshotted into its folder and how it is entered.

The API says what the user sent (a command, a script, a notebook); each back-end says how it
runs there (`command_line`): its own Python (the hub's TrainPool.python, or the image's
`python`) and where an executed notebook is kept (beside the job's files, or with its
checkpoints on Kubernetes, whose working folder is not kept). Nothing rewrites a command line.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum

SCRIPT = "job.py"
NOTEBOOK_IN, NOTEBOOK_OUT = "input.ipynb", "output.ipynb"


class Entry(StrEnum):
    COMMAND = "command"  # the user's own command line, run as given
    SCRIPT = "script"  # job.py, run by the back-end's Python
    NOTEBOOK = "notebook"  # input.ipynb, executed into output.ipynb (gpupool.widgets.execute)


@dataclass(frozen=True)
class JobCode:
    entry: Entry
    files: Mapping[str, bytes] = field(default_factory=dict)
    argv: tuple[str, ...] = ()  # Entry.COMMAND only

    @classmethod
    def command(cls, argv: Sequence[str], files: Mapping[str, bytes] | None = None) -> JobCode:
        return cls(Entry.COMMAND, dict(files or {}), tuple(argv))

    @classmethod
    def script(cls, source: bytes) -> JobCode:
        return cls(Entry.SCRIPT, {SCRIPT: source})

    @classmethod
    def notebook(cls, document: bytes) -> JobCode:
        return cls(Entry.NOTEBOOK, {NOTEBOOK_IN: document})

    def command_line(self, python: str, output_dir: str = "") -> list[str]:
        """The command that runs it with `python`, the executed notebook written in `output_dir`
        (the job's working folder when empty)."""
        if self.entry == Entry.SCRIPT:
            return [python, SCRIPT]
        if self.entry == Entry.NOTEBOOK:
            out = f"{output_dir.rstrip('/')}/{NOTEBOOK_OUT}" if output_dir else NOTEBOOK_OUT
            return [python, "-m", "gpupool.widgets.execute", NOTEBOOK_IN, out]
        return list(self.argv)
