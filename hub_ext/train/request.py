"""A new train job as the API accepted it (every field checked there, against the caller's
projects and the pool): what each training back-end's `submit` takes, built once per job."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from gpupool.train.code import JobCode


# by name only (kw_only): its fields are too alike (three names, two GPU counts) to pass by position
@dataclass(frozen=True, kw_only=True)
class JobRequest:
    owner: str
    project: str
    name: str
    num_gpu: int
    gpu_milli: int  # per GPU: 1000 is a whole one
    code: JobCode  # its files and entry, run as the back-end runs it
    priority: int = 0
    min_runtime_s: float = 0.0
    max_runtime_s: float = 0.0
    min_gpus: int = 0  # an elastic job of min_gpus to num_gpu whole GPUs (0: not elastic)
    pools: tuple[str, ...] = ()  # the node pools it may use, in its order
    sweep_id: str = ""  # a run of this sweep ("": a job of its own)
    sweep_parameters: Mapping[str, object] | None = None  # the parameters this run of the sweep got

    @property
    def least_milli(self) -> int:
        """The GPU it needs to start at all: an elastic job starts on min_gpus whole GPUs."""
        return self.min_gpus * 1000 if self.min_gpus else self.num_gpu * self.gpu_milli
