"""IPython magics: `%gpupool` shows the workspace status widget."""

from __future__ import annotations

from typing import Any


def register(ipython: Any) -> None:
    from IPython.display import display

    from .status import WorkspaceStatus

    def gpupool(line: str = "") -> None:
        """%gpupool — the GPU share this workspace holds and the quota left."""
        display(WorkspaceStatus())

    ipython.register_magic_function(gpupool, "line", "gpupool")
