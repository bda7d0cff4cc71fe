"""GPU-sharing backends on Kubernetes: what a GPU share adds to a pod, as pure functions.

A backend turns `num_gpu` devices of `gpu_milli` each into pod fields (scheduler, labels,
annotations, resource limits). The same backends shape workspace pods (priority class
`build`) and train Job pods (`train`). `requested_milli` reads any final manifest back, so
the quota is checked on what the pod really asks for, whoever set it.

Add a backend by subclassing `SharingBackend` and naming it by import path in
`c.GPUPool.gpu_sharing` (workspaces and train jobs).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from decimal import Decimal
from typing import ClassVar

from gpupool.pool import MILLI_PER_GPU, InvalidRequest

KAI_SCHEDULER = "kai-scheduler"
KAI_QUEUE_LABEL = "kai.scheduler/queue"
GPU = "nvidia.com/gpu"
HAMI_CORES = "nvidia.com/gpucores"
HAMI_MEM = "nvidia.com/gpumem"
MIG_PREFIX = "nvidia.com/mig-"
# MIG profiles of an 80 GB A100/H100 by the fraction (milli-GPU) they stand for
DEFAULT_MIG_PROFILES = {125: "1g.10gb", 250: "2g.20gb", 500: "3g.40gb", 1000: "7g.80gb"}


@dataclass
class PodGPU:
    """Pod fields that carry a GPU share."""

    scheduler_name: str | None = None
    priority_class: str | None = None
    labels: dict[str, str] = field(default_factory=dict)
    annotations: dict[str, str] = field(default_factory=dict)
    limits: dict[str, str] = field(default_factory=dict)


def _check_shape(num_gpu: int, gpu_milli: int) -> None:
    if num_gpu < 1 or not 0 < gpu_milli <= MILLI_PER_GPU:
        raise InvalidRequest(
            f"{num_gpu} x {gpu_milli} milli-GPU is not a GPU share: ask for 1 or more"
            " devices of a fraction (0 < fraction <= 1)"
        )


class SharingBackend:
    """Whole GPUs through the device plugin (`nvidia.com/gpu`); subclasses add fractions."""

    name: ClassVar[str] = "whole"
    scheduler_name: ClassVar[str | None] = None
    # node pools are the scheduler's shards (KAI): a pod goes to one pool, labelled for it
    pools_are_shards: ClassVar[bool] = False

    def pod_gpu(
        self,
        num_gpu: int,
        gpu_milli: int,
        memory_mib: int = 0,
        queue: str = "",
        priority_class: str = "build",
    ) -> PodGPU:
        """Pod fields for `num_gpu` devices of `gpu_milli` each; `memory_mib` is the memory of
        one device (for memory-based fractions)."""
        _check_shape(num_gpu, gpu_milli)
        out = PodGPU(scheduler_name=self.scheduler_name, priority_class=priority_class)
        if gpu_milli == MILLI_PER_GPU:
            out.limits[GPU] = str(num_gpu)
        else:
            self.fraction(out, num_gpu, gpu_milli, memory_mib)
        return out

    def fraction(self, out: PodGPU, num_gpu: int, gpu_milli: int, memory_mib: int) -> None:
        raise InvalidRequest("this hub gives whole GPUs only: choose 1 GPU or more")

    def no_gpu(self, queue: str = "", priority_class: str = "build") -> PodGPU:
        """Pod fields of a pod without a GPU that this backend's scheduler still places (a
        CPU-only workspace): none here, kube-scheduler places it."""
        return PodGPU()


class WholeGPUs(SharingBackend):
    name = "whole"


class KAISharing(SharingBackend):
    """KAI-Scheduler: the queue label on every pod, a `gpu-fraction` (or `gpu-memory`)
    annotation for a fraction of one device (needs KAI's global.gpuSharing=true)."""

    name = "kai"
    scheduler_name = KAI_SCHEDULER
    pools_are_shards = True

    def __init__(self, by_memory: bool = False) -> None:
        self.by_memory = by_memory

    def pod_gpu(
        self,
        num_gpu: int,
        gpu_milli: int,
        memory_mib: int = 0,
        queue: str = "",
        priority_class: str = "build",
    ) -> PodGPU:
        out = super().pod_gpu(num_gpu, gpu_milli, memory_mib, queue, priority_class)
        if queue:
            out.labels[KAI_QUEUE_LABEL] = queue
        return out

    def no_gpu(self, queue: str = "", priority_class: str = "build") -> PodGPU:
        """KAI places every pod of its scheduler name: without a queue label it puts one in
        `default-queue` (which a cluster may not have) with the `train` class (preemptible);
        a CPU-only workspace names its queue and class like a GPU one."""
        out = PodGPU(scheduler_name=self.scheduler_name, priority_class=priority_class)
        if queue:
            out.labels[KAI_QUEUE_LABEL] = queue
        return out

    def fraction(self, out: PodGPU, num_gpu: int, gpu_milli: int, memory_mib: int) -> None:
        if num_gpu != 1:
            raise InvalidRequest(
                "KAI-Scheduler gives a fraction of one GPU or whole GPUs:"
                f" {num_gpu} x {gpu_milli / MILLI_PER_GPU:g} GPU is neither"
            )
        if self.by_memory and memory_mib:
            out.annotations["gpu-memory"] = str(memory_mib * gpu_milli // MILLI_PER_GPU)
        else:
            out.annotations["gpu-fraction"] = f"{gpu_milli / MILLI_PER_GPU:g}"


class HAMiSharing(SharingBackend):
    """HAMi: a device per GPU with a share of its cores (%) and, when known, of its memory."""

    name = "hami"

    def fraction(self, out: PodGPU, num_gpu: int, gpu_milli: int, memory_mib: int) -> None:
        out.limits[GPU] = str(num_gpu)
        out.limits[HAMI_CORES] = str(gpu_milli * 100 // MILLI_PER_GPU)
        if memory_mib:
            out.limits[HAMI_MEM] = str(memory_mib * gpu_milli // MILLI_PER_GPU)


class MIGSharing(SharingBackend):
    """MIG: one MIG device per GPU, its profile chosen by the fraction."""

    name = "mig"

    def __init__(self, profiles: dict[int, str] | None = None) -> None:
        self.profiles = dict(profiles or DEFAULT_MIG_PROFILES)

    def fraction(self, out: PodGPU, num_gpu: int, gpu_milli: int, memory_mib: int) -> None:
        if gpu_milli not in self.profiles:
            raise InvalidRequest(
                f"no MIG profile stands for {gpu_milli / MILLI_PER_GPU:g} GPU; configured:"
                f" {', '.join(f'{m / MILLI_PER_GPU:g}' for m in sorted(self.profiles))}"
            )
        out.limits[MIG_PREFIX + self.profiles[gpu_milli]] = str(num_gpu)


BACKENDS: dict[str, type[SharingBackend]] = {
    b.name: b for b in (KAISharing, HAMiSharing, MIGSharing, WholeGPUs)
}


def make_backend(
    name: str, by_memory: bool = False, mig_profiles: dict[int, str] | None = None
) -> SharingBackend:
    """A backend by short name (kai, hami, mig, whole) or by import path of a subclass."""
    if "." in name:
        from traitlets.utils.importstring import import_item

        cls = import_item(name)
        if not (isinstance(cls, type) and issubclass(cls, SharingBackend)):
            raise InvalidRequest(f"{name} is not a gpupool SharingBackend subclass")
        return cls()
    if name not in BACKENDS:
        raise InvalidRequest(
            f"unknown GPU sharing backend {name!r}; use one of {', '.join(BACKENDS)}"
            " or the import path of a SharingBackend subclass"
        )
    if name == "kai":
        return KAISharing(by_memory)
    if name == "mig":
        return MIGSharing(mig_profiles)
    return BACKENDS[name]()


def split_milli(milli: int) -> tuple[int, int]:
    """A workspace share in milli-GPU as (devices, milli per device): 250 -> (1, 250), 2000 -> (2, 1000)."""
    whole, rest = divmod(milli, MILLI_PER_GPU)
    if milli <= 0 or (whole and rest):
        raise InvalidRequest(f"{milli / MILLI_PER_GPU:g} GPU is neither a fraction of one GPU nor whole GPUs")
    return (whole, MILLI_PER_GPU) if whole else (1, milli)


# --- reading a final manifest back ------------------------------------------------
def _container_milli(c: dict, mig_milli: dict[str, int], memory_mib: int) -> int:
    res = c.get("resources") or {}
    asked: dict[str, str] = {**(res.get("requests") or {}), **(res.get("limits") or {})}
    total = 0
    gpus = int(asked.get(GPU, 0) or 0)
    if gpus:
        per_gpu = MILLI_PER_GPU
        if HAMI_CORES in asked or HAMI_MEM in asked:
            # HAMi: the larger of the core share and the memory share (unknown device size: whole)
            cores = int(asked.get(HAMI_CORES, 0)) * MILLI_PER_GPU // 100
            mem = 0
            if HAMI_MEM in asked:
                mem = (
                    math.ceil(int(asked[HAMI_MEM]) * MILLI_PER_GPU / memory_mib)
                    if memory_mib
                    else MILLI_PER_GPU
                )
            per_gpu = min(MILLI_PER_GPU, max(cores, mem))
        total += gpus * per_gpu
    for key, value in asked.items():
        if key.startswith(MIG_PREFIX):
            # an unknown profile counts as a whole GPU: never less than it may be
            total += mig_milli.get(key.removeprefix(MIG_PREFIX), MILLI_PER_GPU) * int(value)
    return total


def requested_milli(pod: dict, memory_mib: int = 0, mig_profiles: dict[int, str] | None = None) -> int:
    """GPU milli a final pod manifest (a dict as sent to the API) asks for, whatever set it:
    device-plugin GPUs, HAMi cores/memory, MIG devices, KAI fraction or memory annotations.
    `memory_mib` is one device's memory (to read memory-based shares); init containers count
    as Kubernetes counts them (the larger of the longest init step and the running pod)."""
    mig_milli = {v: k for k, v in (mig_profiles or DEFAULT_MIG_PROFILES).items()}
    spec = pod.get("spec") or {}
    running = sum(_container_milli(c, mig_milli, memory_mib) for c in spec.get("containers") or [])
    init = 0
    for c in spec.get("initContainers") or []:
        milli = _container_milli(c, mig_milli, memory_mib)
        if c.get("restartPolicy") == "Always":  # a sidecar runs beside the containers
            running += milli
        else:
            init = max(init, milli)
    annotations = (pod.get("metadata") or {}).get("annotations") or {}
    if "gpu-fraction" in annotations:
        running += math.ceil(Decimal(annotations["gpu-fraction"]) * MILLI_PER_GPU)
    if "gpu-memory" in annotations:
        # without the device size a memory share may be a whole GPU
        mem = int(annotations["gpu-memory"])
        running += (
            min(MILLI_PER_GPU, math.ceil(mem * MILLI_PER_GPU / memory_mib)) if memory_mib else MILLI_PER_GPU
        )
    return max(running, init)
