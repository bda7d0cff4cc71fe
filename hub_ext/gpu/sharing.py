"""GPU-sharing backends on Kubernetes: what a GPU share adds to a pod, as pure functions.

A backend turns `num_gpu` devices of `gpu_milli` each into pod fields (scheduler, labels,
annotations, resource limits). The same backends shape workspace pods (priority class
`build`) and train Job pods (`train`). Each backend also reads its own fields back
(`read_fraction`, `read_annotations`); `requested_milli` reads any final manifest with the
configured backend and every built-in one, so the quota is checked on what the pod really asks
for, whoever set it. A GPU resource no backend reads is counted as whole GPUs (`<vendor>/gpu`)
or refused with the reason, never counted as 0.

Add a backend by subclassing `SharingBackend` (`fraction` and `read_fraction` as a pair) and
naming it by import path in `c.GPUPool.gpu_sharing` (workspaces and train jobs).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any, ClassVar

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


@dataclass
class Claim:
    """What a backend read from a pod: milli-GPU, and the resource (or annotation) names it
    read, which no later backend reads again."""

    milli: int = 0
    names: frozenset[str] = frozenset()


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

    def read_fraction(self, asked: Mapping[str, str], memory_mib: int) -> Claim:
        """milli-GPU that one container's resources (requests and limits merged) ask for
        through the fields `fraction` writes, and the names of the resources read. Whole GPUs
        (`<vendor>/gpu`) are read by `requested_milli` after every backend's fractions, so a
        fraction backend may claim `nvidia.com/gpu` with its own fields first."""
        return Claim()

    def read_annotations(self, annotations: Mapping[str, str], memory_mib: int) -> Claim:
        """milli-GPU that the pod's annotations ask for through this backend, and the keys read."""
        return Claim()

    def requested_milli(self, pod: dict[str, object], memory_mib: int = 0) -> int:
        """What a pod this backend made asks for, read by this backend alone."""
        return read_pod(pod, [self], memory_mib)

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

    def read_annotations(self, annotations: Mapping[str, str], memory_mib: int) -> Claim:
        milli, names = 0, set()
        if "gpu-fraction" in annotations:
            milli += math.ceil(Decimal(annotations["gpu-fraction"]) * MILLI_PER_GPU)
            names.add("gpu-fraction")
        if "gpu-memory" in annotations:
            # without the device size a memory share may be a whole GPU
            mem = int(annotations["gpu-memory"])
            milli += (
                min(MILLI_PER_GPU, math.ceil(mem * MILLI_PER_GPU / memory_mib))
                if memory_mib
                else MILLI_PER_GPU
            )
            names.add("gpu-memory")
        return Claim(milli, frozenset(names))


class HAMiSharing(SharingBackend):
    """HAMi: a device per GPU with a share of its cores (%) and, when known, of its memory."""

    name = "hami"

    def fraction(self, out: PodGPU, num_gpu: int, gpu_milli: int, memory_mib: int) -> None:
        out.limits[GPU] = str(num_gpu)
        out.limits[HAMI_CORES] = str(gpu_milli * 100 // MILLI_PER_GPU)
        if memory_mib:
            out.limits[HAMI_MEM] = str(memory_mib * gpu_milli // MILLI_PER_GPU)

    def read_fraction(self, asked: Mapping[str, str], memory_mib: int) -> Claim:
        if HAMI_CORES not in asked and HAMI_MEM not in asked:
            return Claim()
        if GPU not in asked:
            given = " and ".join(k for k in (HAMI_CORES, HAMI_MEM) if k in asked)
            raise UnreadableGPU(
                f"{given} without {GPU}: HAMi then gives its own default number of devices,"
                f" which the hub cannot know; give {GPU} too"
            )
        # the larger of the core share and the memory share (unknown device size: whole)
        cores = int(asked.get(HAMI_CORES, 0)) * MILLI_PER_GPU // 100
        mem = 0
        if HAMI_MEM in asked:
            mem = (
                math.ceil(int(asked[HAMI_MEM]) * MILLI_PER_GPU / memory_mib) if memory_mib else MILLI_PER_GPU
            )
        per_gpu = min(MILLI_PER_GPU, max(cores, mem))
        return Claim(
            count(GPU, asked[GPU]) * per_gpu, frozenset(k for k in (GPU, HAMI_CORES, HAMI_MEM) if k in asked)
        )


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

    def read_fraction(self, asked: Mapping[str, str], memory_mib: int) -> Claim:
        by_name = {v: k for k, v in self.profiles.items()}
        milli, names = 0, set()
        for key, value in asked.items():
            if key.startswith(MIG_PREFIX):
                # an unknown profile counts as a whole GPU: never less than it may be
                milli += by_name.get(key.removeprefix(MIG_PREFIX), MILLI_PER_GPU) * count(key, value)
                names.add(key)
        return Claim(milli, frozenset(names))


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
class UnreadableGPU(ValueError):
    """A pod asks for GPU in a way no sharing backend of this hub can count."""


def count(name: str, value: object) -> int:
    """A device count from a pod's resources: a whole number, 0 or more (a negative one would
    hide another container's devices from the sum; the API server refuses it anyway)."""
    n = int(str(value or 0))
    if n < 0:
        raise UnreadableGPU(f"{name}: {n} is not a number of devices")
    return n


def _is_gpu_resource(name: str) -> bool:
    vendor, _, resource = name.rpartition("/")
    return "gpu" in name.lower() or resource.startswith("mig-") or vendor in ("nvidia.com", "amd.com")


def _container_milli(c: dict[str, Any], readers: Sequence[SharingBackend], memory_mib: int) -> int:
    res = c.get("resources") or {}
    left: dict[str, str] = {**(res.get("requests") or {}), **(res.get("limits") or {})}
    total = 0
    for backend in readers:  # fractions first: their fields may include `nvidia.com/gpu`
        claim = backend.read_fraction(left, memory_mib)
        total += claim.milli
        left = {k: v for k, v in left.items() if k not in claim.names}
    for name, value in left.items():
        if name.rpartition("/")[2] == "gpu":  # a device plugin's whole GPUs (nvidia.com, amd.com...)
            total += count(name, value) * MILLI_PER_GPU
        elif _is_gpu_resource(name):
            raise UnreadableGPU(
                f"{name} is a GPU resource no sharing backend of this hub reads"
                f" ({', '.join(sorted({b.name for b in readers}))}), so its share is unknown"
            )
    return total


def read_pod(pod: dict[str, Any], readers: Sequence[SharingBackend], memory_mib: int = 0) -> int:
    """GPU milli a final pod manifest asks for, read by `readers` in order (each reads what
    the earlier ones left); init containers count as Kubernetes counts them (the larger of the
    longest init step and the running pod)."""
    spec = pod.get("spec") or {}
    running = sum(_container_milli(c, readers, memory_mib) for c in spec.get("containers") or [])
    init = 0
    for c in spec.get("initContainers") or []:
        milli = _container_milli(c, readers, memory_mib)
        if c.get("restartPolicy") == "Always":  # a sidecar runs beside the containers
            running += milli
        else:
            init = max(init, milli)
    left: Mapping[str, str] = (pod.get("metadata") or {}).get("annotations") or {}
    for backend in readers:
        claim = backend.read_annotations(left, memory_mib)
        running += claim.milli
        left = {k: v for k, v in left.items() if k not in claim.names}
    return max(running, init)


def requested_milli(
    pod: dict[str, object],
    memory_mib: int = 0,
    mig_profiles: dict[int, str] | None = None,
    backend: SharingBackend | None = None,
) -> int:
    """GPU milli a final pod manifest (a dict as sent to the API) asks for, whatever set it:
    read by the configured `backend` first, then by every built-in one (device-plugin GPUs,
    HAMi cores/memory, MIG devices, KAI fraction or memory annotations). `memory_mib` is one
    device's memory (to read memory-based shares). Raises `UnreadableGPU` (a ValueError) for a
    GPU resource none of them reads."""
    builtins: list[SharingBackend] = [KAISharing(), HAMiSharing(), MIGSharing(mig_profiles)]
    return read_pod(pod, ([backend] if backend is not None else []) + builtins, memory_mib)
