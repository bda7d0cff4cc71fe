"""The only module that calls NVML (nvidia-ml-py, imported as `pynvml`).

Everything above it sees plain dataclasses, so discovery and sampling can be faked at
this one boundary on machines without a GPU, and the real calls stay few and visible.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # gpupool.pool imports numpy, which the node agent (its image) does without
    from gpupool.pool import GPU

log = logging.getLogger("gpupool.gpu.nvml")

try:  # nvidia-ml-py is a dependency, but the shared library is only there with a driver
    import pynvml
except ImportError:  # pragma: no cover - dependency missing
    pynvml = None


@dataclass(frozen=True)
class ProcessSample:
    pid: int
    gpu_uuid: str
    sm_util_pct: int  # 0..100 over the sampling window; 0 when NVML has no sample
    memory_mib: int


@dataclass(frozen=True)
class DeviceSample:
    gpu_uuid: str
    util_pct: int
    memory_used_mib: int
    memory_total_mib: int


class NVMLUnavailable(RuntimeError):
    """No driver, no library, or no GPU."""


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


class NVML:
    """A small adapter around the real library. Call `open()` once, then the queries."""

    def __init__(self) -> None:
        self._open = False
        self._last_seen: dict[str, int] = {}  # uuid -> last sample timestamp (µs)

    def open(self) -> None:
        if pynvml is None:
            raise NVMLUnavailable("nvidia-ml-py is not installed")
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError as err:
            raise NVMLUnavailable(f"NVML could not start: {err}") from err
        self._open = True

    def close(self) -> None:
        if self._open:
            pynvml.nvmlShutdown()
            self._open = False

    def gpus(self) -> list[GPU]:
        from gpupool.pool import GPU  # the hub's inventory only (see the import above)

        out = []
        for i in range(pynvml.nvmlDeviceGetCount()):
            h = pynvml.nvmlDeviceGetHandleByIndex(i)
            mem = _memory_info(h)
            out.append(
                GPU(
                    index=i,
                    uuid=_text(pynvml.nvmlDeviceGetUUID(h)),
                    model=_text(pynvml.nvmlDeviceGetName(h)),
                    memory_mib=int(mem.total) // (1024 * 1024),
                    minor=_minor(h, i),
                    reserved_mib=int(getattr(mem, "reserved", 0) or 0) // (1024 * 1024),
                )
            )
        return out

    def device_samples(self) -> list[DeviceSample]:
        out = []
        for i in range(pynvml.nvmlDeviceGetCount()):
            h = pynvml.nvmlDeviceGetHandleByIndex(i)
            util = pynvml.nvmlDeviceGetUtilizationRates(h)
            mem = pynvml.nvmlDeviceGetMemoryInfo(h)
            out.append(
                DeviceSample(
                    gpu_uuid=_text(pynvml.nvmlDeviceGetUUID(h)),
                    util_pct=int(util.gpu),
                    memory_used_mib=int(mem.used) // (1024 * 1024),
                    memory_total_mib=int(mem.total) // (1024 * 1024),
                )
            )
        return out

    def process_samples(self) -> list[ProcessSample]:
        """Per-process SM use since the last call and memory now, on every GPU."""
        out = []
        for i in range(pynvml.nvmlDeviceGetCount()):
            h = pynvml.nvmlDeviceGetHandleByIndex(i)
            uuid = _text(pynvml.nvmlDeviceGetUUID(h))
            memory = {
                p.pid: int(p.usedGpuMemory or 0) // (1024 * 1024)
                for p in pynvml.nvmlDeviceGetComputeRunningProcesses(h)
            }
            util: dict[int, int] = {}
            try:
                samples = pynvml.nvmlDeviceGetProcessUtilization(h, self._last_seen.get(uuid, 0))
            except pynvml.NVMLError_NotFound:
                samples = []  # no process ran a kernel since the last timestamp: 0 %
            for s in samples:
                util[s.pid] = max(util.get(s.pid, 0), int(s.smUtil))
                self._last_seen[uuid] = max(self._last_seen.get(uuid, 0), int(s.timeStamp))
            for pid in set(memory) | set(util):
                out.append(ProcessSample(pid, uuid, util.get(pid, 0), memory.get(pid, 0)))
        return out


def _memory_info(handle):
    """Memory info with what the driver reserves (NVML's v2 struct, driver 510+), else v1's."""
    version = getattr(pynvml, "nvmlMemory_v2", None)
    if version is not None:
        try:
            return pynvml.nvmlDeviceGetMemoryInfo(handle, version=version)
        except (pynvml.NVMLError, TypeError):
            pass
    return pynvml.nvmlDeviceGetMemoryInfo(handle)


def _minor(handle, index: int) -> int:
    """The GPU's device node, /dev/nvidia<minor> (what its devices cgroup rule names); the index
    where NVML cannot say (its usual value)."""
    try:
        return int(pynvml.nvmlDeviceGetMinorNumber(handle))
    except (pynvml.NVMLError, AttributeError):
        return index


class VirtualGPUs:
    """NVML's surface on a node whose GPUs are virtual (no driver: a demo, teaching or test
    cluster; the node agent's --virtual-gpus, as c.GPUPool.virtual_gpus is the hub's): `count`
    idle devices and no process on any, so every pod on the node reads as never having opened
    CUDA. Nothing is sampled: there is nothing to sample."""

    def __init__(self, count: int, memory_mib: int = 16384) -> None:
        self.count, self.memory_mib = count, memory_mib

    def open(self) -> None:
        log.warning("no NVML: reporting %d virtual GPU(s), idle, with no process", self.count)

    def close(self) -> None:
        pass

    def device_samples(self) -> list[DeviceSample]:
        return [DeviceSample(f"GPU-virtual-{i}", 0, 0, self.memory_mib) for i in range(self.count)]

    def process_samples(self) -> list[ProcessSample]:
        return []


def discover_gpus() -> list[GPU]:
    """GPUs NVML can see, or [] where there is no driver or no GPU (logged, not raised)."""
    nvml = NVML()
    try:
        nvml.open()
    except NVMLUnavailable as err:
        log.info("no NVIDIA GPU found (%s)", err)
        return []
    try:
        return nvml.gpus()
    finally:
        nvml.close()
