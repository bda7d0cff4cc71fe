"""Notebook widgets for gpupool: `%load_ext widgets`, then `%gpupool` shows this workspace's GPU share."""

from .client import Client, GPUPoolError
from .status import WorkspaceStatus

__all__ = ["Client", "GPUPoolError", "WorkspaceStatus", "load_ipython_extension"]


def load_ipython_extension(ipython) -> None:
    from .magics import register

    register(ipython)
