"""Notebook widgets for gpupool: `%load_ext gpupool`, then `%gpupool` shows this workspace's GPU
share and `%%train --project P --gpus 1` sends a cell to the training pool."""

from .client import Client, GPUPoolError
from .jobs import JobMonitor, PromoteToTraining
from .status import WorkspaceStatus

__all__ = ["Client", "GPUPoolError", "JobMonitor", "PromoteToTraining", "WorkspaceStatus",
           "load_ipython_extension"]


def load_ipython_extension(ipython) -> None:
    from .magics import register

    register(ipython)
