"""What a workload asks for, and where it was put."""

from __future__ import annotations

from dataclasses import dataclass

from gpupool.pool.errors import InvalidRequest
from gpupool.pool.units import MILLI_PER_GPU, format_gpus


@dataclass(frozen=True)
class Request:
    """A placement request.

    `gpu_milli` is the share of ONE GPU: below 1000 only when `num_gpu` == 1 (a sharing
    workload); a workload of k whole GPUs has num_gpu=k, gpu_milli=1000.
    `gpu_models` empty means any model.
    """

    num_gpu: int
    gpu_milli: int = MILLI_PER_GPU
    cpu_milli: int = 0
    memory_mib: int = 0
    gpu_models: frozenset[str] = frozenset()

    def __post_init__(self) -> None:
        for name in ("num_gpu", "gpu_milli", "cpu_milli", "memory_mib"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise InvalidRequest(f"{name} must be a whole number >= 0, got {value!r}")
        if self.num_gpu == 0 and self.gpu_milli not in (0, MILLI_PER_GPU):
            raise InvalidRequest("a CPU-only request cannot ask for a GPU share")
        if self.num_gpu >= 1 and not 0 < self.gpu_milli <= MILLI_PER_GPU:
            raise InvalidRequest(f"a GPU share must be between 1 and {MILLI_PER_GPU} milli-GPU")
        if self.num_gpu > 1 and self.gpu_milli != MILLI_PER_GPU:
            raise InvalidRequest("fractions are for one GPU; ask for whole GPUs when you need several")

    @classmethod
    def for_gpus(cls, milli: int, **kwargs: object) -> Request:
        """0.25 GPU -> one GPU at 250 milli; 2 GPUs -> two whole GPUs."""
        if milli <= 0:
            raise InvalidRequest(f"ask for more than 0 GPU, got {format_gpus(milli)}")
        if milli < MILLI_PER_GPU:
            return cls(num_gpu=1, gpu_milli=milli, **kwargs)  # type: ignore[arg-type]
        if milli % MILLI_PER_GPU:
            raise InvalidRequest(f"{format_gpus(milli)} is more than one GPU but not a whole number of GPUs")
        return cls(num_gpu=milli // MILLI_PER_GPU, **kwargs)  # type: ignore[arg-type]

    @property
    def total_milli(self) -> int:
        return self.num_gpu * self.gpu_milli if self.num_gpu else 0

    @property
    def is_sharing(self) -> bool:
        return self.num_gpu == 1 and self.gpu_milli < MILLI_PER_GPU


@dataclass(frozen=True)
class Placement:
    """Where a request landed: a node and the GPU indices on it (each at `gpu_milli`)."""

    node: str
    gpus: tuple[int, ...]
    gpu_milli: int
    cpu_milli: int = 0
    memory_mib: int = 0

    @property
    def total_milli(self) -> int:
        return len(self.gpus) * self.gpu_milli
