"""What a train job needs to run on Kubernetes (the training pool's model maps onto it)."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from gpupool.pool import MILLI_PER_GPU, InvalidRequest
from gpupool.pool.pools import NodePool

if TYPE_CHECKING:
    from gpupool.store import TrainJob

_ID = re.compile(r"^[a-z0-9]([-a-z0-9]{0,40}[a-z0-9])?$")
_FILE = re.compile(r"^[A-Za-z0-9_][-._A-Za-z0-9]{0,99}$")  # a ConfigMap key, never a path


@dataclass(frozen=True)
class TrainJobSpec:
    id: str  # lower-case letters, digits, '-': it names the Job
    owner: str
    project: str
    num_gpu: int  # devices; 0 = a CPU-only job
    gpu_milli: int  # milli-GPU on each device (1000 = whole)
    command: list[str]
    image: str
    env: dict[str, str] = field(default_factory=dict)
    max_runtime_s: float = 0.0  # 0: none
    files: tuple[str, ...] = ()  # code snapshotted at submission (a ConfigMap), in the working folder
    priority: int = 0  # within its project: above 0 gets JobOptions.high_priority_class
    pools: tuple[NodePool, ...] = ()  # node pools its pods may use, in order of preference (empty: any node)
    queue_pool: str = ""  # a guarantee per pool: the pool whose queue it waits in (KAI's node-pool label)
    min_gpus: int = 0  # elastic: min_gpus to num_gpu pods of one GPU each (0: a fixed-size job)

    def __post_init__(self) -> None:
        if not _ID.match(self.id):
            raise InvalidRequest(
                f"job id {self.id!r} must be lower-case letters, digits and '-' (at most 42)"
            )
        if not self.command or not all(isinstance(a, str) for a in self.command):
            raise InvalidRequest("a train job needs a command: a list of strings")
        if not self.image:
            raise InvalidRequest("a train job on Kubernetes needs a container image")
        if self.num_gpu < 0 or (self.num_gpu and not 0 < self.gpu_milli <= MILLI_PER_GPU):
            raise InvalidRequest(f"{self.num_gpu} x {self.gpu_milli} milli-GPU is not a GPU request")
        if self.max_runtime_s < 0:
            raise InvalidRequest("max_runtime_s must be 0 (none) or more")
        if self.min_gpus and not (1 <= self.min_gpus <= self.num_gpu and self.gpu_milli == MILLI_PER_GPU):
            raise InvalidRequest(
                "an elastic job runs on min_gpus to num_gpu whole GPUs (1 <= min_gpus <= num_gpu)"
            )
        for name in self.files:
            if not _FILE.match(name):
                raise InvalidRequest(f"file name {name!r} must be letters, digits, '.', '_' or '-'")

    @property
    def total_milli(self) -> int:
        return self.num_gpu * self.gpu_milli

    @classmethod
    def from_train_job(
        cls,
        row: TrainJob,
        image: str,
        env: dict[str, str] | None = None,
        files: tuple[str, ...] = (),
        **more: Any,
    ) -> TrainJobSpec:
        """From the training pool's job row (gpupool.store.TrainJob); `more`: pools,
        queue_pool, min_gpus."""
        return cls(
            id=row.id,
            owner=row.owner,
            project=row.project,
            num_gpu=row.num_gpu,
            gpu_milli=row.gpu_milli,
            command=list(row.command),
            image=image,
            env=dict(env or {}),
            max_runtime_s=float(row.max_runtime_s or 0),
            files=tuple(files),
            priority=int(row.priority or 0),
            **more,
        )
