"""What a GPU share adds to a workspace pod, per sharing backend: pure functions of the share,
in the spirit of kubespawner's objects.py, so they are tested without a cluster."""

from __future__ import annotations

from dataclasses import dataclass, field

from hub_ext.pool import MILLI_PER_GPU, InvalidRequest

BACKENDS = ("kai", "hami", "mig", "whole")
# MIG profiles of an 80 GB A100/H100 by the fraction they stand for
DEFAULT_MIG_PROFILES = {125: "1g.10gb", 250: "2g.20gb", 500: "3g.40gb", 1000: "7g.80gb"}


@dataclass
class PodGPU:
    scheduler_name: str | None = None
    priority_class: str | None = None
    labels: dict[str, str] = field(default_factory=dict)
    annotations: dict[str, str] = field(default_factory=dict)
    limits: dict[str, str] = field(default_factory=dict)


def pod_gpu(backend: str, milli: int, memory_mib: int = 0, queue: str = "", priority_class: str = "build",
            mig_profiles: dict[int, str] | None = None, fraction_by_memory: bool = False) -> PodGPU:
    """The pod fields that give a workspace `milli` GPU under `backend`."""
    if backend not in BACKENDS:
        raise InvalidRequest(f"unknown GPU sharing backend {backend!r}; use one of {', '.join(BACKENDS)}")
    whole, rest = divmod(milli, MILLI_PER_GPU)
    if milli <= 0 or (whole and rest):
        raise InvalidRequest(f"{milli} milli-GPU is neither a fraction of one GPU nor whole GPUs")
    out = PodGPU(priority_class=priority_class)
    if backend == "kai":
        out.scheduler_name = "kai-scheduler"
        if queue:
            out.labels["kai.scheduler/queue"] = queue
        if whole:
            out.limits["nvidia.com/gpu"] = str(whole)
        elif fraction_by_memory and memory_mib:
            out.annotations["gpu-memory"] = str(memory_mib)
        else:
            out.annotations["gpu-fraction"] = f"{milli / MILLI_PER_GPU:g}"
    elif backend == "hami":
        out.limits["nvidia.com/gpu"] = str(max(1, whole))
        if not whole:
            out.limits["nvidia.com/gpucores"] = str(milli * 100 // MILLI_PER_GPU)
            if memory_mib:
                out.limits["nvidia.com/gpumem"] = str(memory_mib)
    elif backend == "mig":
        if whole:
            out.limits["nvidia.com/gpu"] = str(whole)
        else:
            profiles = mig_profiles or DEFAULT_MIG_PROFILES
            if milli not in profiles:
                raise InvalidRequest(f"no MIG profile stands for {milli / 1000:g} GPU; configured:"
                                     f" {', '.join(f'{m / 1000:g}' for m in sorted(profiles))}")
            out.limits[f"nvidia.com/mig-{profiles[milli]}"] = "1"
    else:  # whole GPUs only
        if not whole:
            raise InvalidRequest("this hub gives whole GPUs only: choose 1 GPU or more")
        out.limits["nvidia.com/gpu"] = str(whole)
    return out


def requested_milli(pod: dict, mig_profiles: dict[int, str] | None = None) -> int:
    """GPU milli a final pod manifest asks for, whatever set it (profile, user option, hook)."""
    profiles = {v: k for k, v in (mig_profiles or DEFAULT_MIG_PROFILES).items()}
    annotations = (pod.get("metadata") or {}).get("annotations") or {}
    total = 0
    for c in (pod.get("spec") or {}).get("containers") or []:
        limits = ((c.get("resources") or {}).get("limits")) or {}
        for key, value in limits.items():
            if key == "nvidia.com/gpu":
                gpus = int(value)
                cores = limits.get("nvidia.com/gpucores")
                total += gpus * MILLI_PER_GPU if not cores else int(cores) * MILLI_PER_GPU // 100
            elif key.startswith("nvidia.com/mig-"):
                total += profiles.get(key.removeprefix("nvidia.com/mig-"), MILLI_PER_GPU) * int(value)
    if "gpu-fraction" in annotations:
        total += round(float(annotations["gpu-fraction"]) * MILLI_PER_GPU)
    return total
