"""The one module that calls pynvml, checked against pynvml's own API surface.

No GPU here, so the pynvml functions the adapter calls are replaced by fakes that return
pynvml's own structs and raise pynvml's own errors; a test marked `gpu` runs the real thing
where a GPU exists.
"""

from __future__ import annotations

from types import SimpleNamespace

import pynvml
import pytest

from gpupool.gpu import nvml as adapter

MIB = 1024 * 1024


class FakeNVML:
    def __init__(self, gpus: list[dict]) -> None:
        self.gpus, self.calls = gpus, []

    def install(self, mp: pytest.MonkeyPatch) -> None:
        mp.setattr(pynvml, "nvmlInit", lambda: None)
        mp.setattr(pynvml, "nvmlShutdown", lambda: None)
        mp.setattr(pynvml, "nvmlDeviceGetCount", lambda: len(self.gpus))
        mp.setattr(pynvml, "nvmlDeviceGetHandleByIndex", lambda i: i)
        mp.setattr(pynvml, "nvmlDeviceGetUUID", lambda h: self.gpus[h]["uuid"])
        mp.setattr(pynvml, "nvmlDeviceGetName", lambda h: self.gpus[h]["name"])
        mp.setattr(
            pynvml,
            "nvmlDeviceGetMemoryInfo",
            lambda h: SimpleNamespace(total=self.gpus[h]["mem"] * MIB, used=self.gpus[h]["used"] * MIB),
        )
        mp.setattr(
            pynvml, "nvmlDeviceGetUtilizationRates", lambda h: SimpleNamespace(gpu=self.gpus[h]["util"])
        )
        mp.setattr(
            pynvml,
            "nvmlDeviceGetComputeRunningProcesses",
            lambda h: [
                SimpleNamespace(pid=p, usedGpuMemory=m * MIB) for p, m in self.gpus[h]["procs"].items()
            ],
        )
        mp.setattr(pynvml, "nvmlDeviceGetProcessUtilization", self.process_utilization)

    def process_utilization(self, handle, last_seen):
        self.calls.append((handle, last_seen))
        samples = self.gpus[handle]["samples"]
        if isinstance(samples, Exception):
            raise samples
        return [SimpleNamespace(pid=p, smUtil=u, timeStamp=ts) for p, u, ts in samples if ts > last_seen]


def h100(**kw) -> dict:
    return {
        "uuid": "GPU-aaaa",
        "name": "NVIDIA H100 80GB HBM3",
        "mem": 81559,
        "used": 0,
        "util": 0,
        "procs": {},
        "samples": [],
        **kw,
    }


def test_discovery_reads_uuid_model_and_memory(monkeypatch) -> None:
    FakeNVML([h100(), h100(uuid="GPU-bbbb", name=b"NVIDIA A10")]).install(monkeypatch)
    gpus = adapter.discover_gpus()
    assert [(g.index, g.uuid, g.model, g.memory_mib, g.virtual) for g in gpus] == [
        (0, "GPU-aaaa", "NVIDIA H100 80GB HBM3", 81559, False),
        (1, "GPU-bbbb", "NVIDIA A10", 81559, False),
    ]


def test_no_driver_means_no_gpus_not_a_crash(monkeypatch) -> None:
    def fail():
        raise pynvml.NVMLError(pynvml.NVML_ERROR_LIBRARY_NOT_FOUND)

    monkeypatch.setattr(pynvml, "nvmlInit", fail)
    assert adapter.discover_gpus() == []


def test_process_samples_pass_the_last_timestamp_and_treat_not_found_as_idle(monkeypatch) -> None:
    fake = FakeNVML([h100(procs={11: 2048, 12: 512}, samples=[(11, 70, 1000), (12, 5, 1001)])])
    fake.install(monkeypatch)
    nv = adapter.NVML()
    nv.open()
    first = {p.pid: (p.sm_util_pct, p.memory_mib) for p in nv.process_samples()}
    assert first == {11: (70, 2048), 12: (5, 512)}
    fake.gpus[0]["samples"] = pynvml.NVMLError_NotFound()  # nothing ran since the last sample
    second = {p.pid: (p.sm_util_pct, p.memory_mib) for p in nv.process_samples()}
    assert second == {11: (0, 2048), 12: (0, 512)}
    assert fake.calls == [(0, 0), (0, 1001)]  # the second call asked only for newer samples


def test_device_samples(monkeypatch) -> None:
    FakeNVML([h100(used=4096, util=93)]).install(monkeypatch)
    nv = adapter.NVML()
    nv.open()
    [d] = nv.device_samples()
    assert (d.gpu_uuid, d.util_pct, d.memory_used_mib, d.memory_total_mib) == ("GPU-aaaa", 93, 4096, 81559)


def _real_gpu() -> bool:
    try:
        pynvml.nvmlInit()
        count = pynvml.nvmlDeviceGetCount()
        pynvml.nvmlShutdown()
        return count > 0
    except pynvml.NVMLError:
        return False


@pytest.mark.gpu
@pytest.mark.skipif(not _real_gpu(), reason="no NVIDIA GPU with NVML here")
def test_real_nvml_discovers_and_samples() -> None:
    gpus = adapter.discover_gpus()
    assert gpus and all(g.uuid.startswith("GPU-") and g.memory_mib > 0 for g in gpus)
    nv = adapter.NVML()
    nv.open()
    assert len(nv.device_samples()) == len(gpus)
    nv.process_samples()  # must not raise, even with no process on the GPU


def test_discovery_reads_each_gpus_device_minor_and_the_drivers_reserve(monkeypatch) -> None:
    fake = FakeNVML([h100(), h100(uuid="GPU-bbbb")])
    fake.install(monkeypatch)
    # NVML's minor number names /dev/nvidia<minor>, which the devices cgroup allows: not always the index
    monkeypatch.setattr(pynvml, "nvmlDeviceGetMinorNumber", lambda h: [3, 0][h])
    monkeypatch.setattr(
        pynvml,
        "nvmlDeviceGetMemoryInfo",
        lambda h, version=None: SimpleNamespace(
            total=81559 * MIB, used=0, reserved=(512 * MIB if version else 0)
        ),
    )
    gpus = adapter.discover_gpus()
    assert [(g.index, g.device_minor, g.reserved_mib) for g in gpus] == [(0, 3, 512), (1, 0, 512)]
