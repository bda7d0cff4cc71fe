"""Notebook widgets for gpupool: `%load_ext gpupool`, then `%gpupool` shows this workspace's GPU
share and `%%train --project P --gpus 1` sends a cell to the training pool."""

from gpupool.widgets.client import Client, GPUPoolError
from gpupool.widgets.jobs import JobMonitor, PromoteToTraining
from gpupool.widgets.status import WorkspaceStatus

__all__ = [
    "Client",
    "GPUPoolError",
    "JobMonitor",
    "PromoteToTraining",
    "WorkspaceStatus",
    "load_ipython_extension",
]


def load_ipython_extension(ipython) -> None:
    from gpupool.widgets.magics import register

    register(ipython)
