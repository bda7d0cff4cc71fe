"""Per-pod GPU use from NVML samples: pure, given how to find a process's pod."""

from __future__ import annotations

from collections.abc import Callable, Iterable

from gpupool.gpu.nvml import DeviceSample, ProcessSample
from gpupool.vocab.agent_wire import DeviceUse, PodUse


def per_pod(processes: Iterable[ProcessSample], pod_of: Callable[[int], str | None]) -> list[PodUse]:
    """`[{"uid", "gpu_util_pct", "memory_mib", "gpus"}]`: a pod's processes on one GPU add up
    (capped at 100 %), and a pod on several GPUs reports its busiest one."""
    by_gpu: dict[str, dict[str, float]] = {}
    memory: dict[str, int] = {}
    for s in processes:
        uid = pod_of(s.pid)
        if uid is None:  # not in a pod: the host, or a container outside Kubernetes
            continue
        gpus = by_gpu.setdefault(uid, {})
        gpus[s.gpu_uuid] = min(100.0, gpus.get(s.gpu_uuid, 0.0) + float(s.sm_util_pct))
        memory[uid] = memory.get(uid, 0) + s.memory_mib
    return [
        {"uid": uid, "gpu_util_pct": max(gpus.values()), "memory_mib": memory[uid], "gpus": sorted(gpus)}
        for uid, gpus in sorted(by_gpu.items())
    ]


def per_gpu(devices: Iterable[DeviceSample]) -> list[DeviceUse]:
    return [
        {
            "uuid": d.gpu_uuid,
            "util_pct": float(d.util_pct),
            "memory_used_mib": d.memory_used_mib,
            "memory_total_mib": d.memory_total_mib,
        }
        for d in devices
    ]
