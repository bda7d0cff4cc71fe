"""The parking backends' contract: the driver's state machine, modelled delays, no frozen process."""

from __future__ import annotations

import sys

import pytest

from gpupool.gpu.cuda_checkpoint import uuid_bytes
from gpupool.gpu.parking import (
    Delays,
    ParkingError,
    VirtualParking,
    make_backend,
    park_process,
    resume_process,
)


def virtual(tmp_path, pids=(100, 101), mib=4096):
    slept: list[float] = []
    backend = VirtualParking(
        tmp_path,
        has_context=lambda pid: pid in pids,
        memory_mib=lambda pid: mib,
        delays=Delays(fixed_s=0.5, per_gib_s=0.25),
        sleep=slept.append,
    )
    return backend, slept


def test_park_then_resume_walks_the_driver_states(tmp_path):
    b, slept = virtual(tmp_path)
    assert b.state(100) == "running"
    assert park_process(b, 100) is True
    assert b.state(100) == "checkpointed"
    resume_process(b, 100, {"GPU-a": "GPU-b"})
    assert b.state(100) == "running"
    # 4 GiB at 0.25 s/GiB + 0.5 s, once to checkpoint and once to restore
    assert slept == [1.5, 1.5]


def test_a_process_without_cuda_context_is_not_checkpointed(tmp_path):
    b, slept = virtual(tmp_path)
    assert park_process(b, 555) is False
    assert b.state(555) == "none" and slept == []


def test_state_survives_a_new_backend_on_the_same_folder(tmp_path):
    b, _ = virtual(tmp_path)
    park_process(b, 100)
    again, _ = virtual(tmp_path)  # the hub restarted
    assert again.state(100) == "checkpointed"
    assert park_process(again, 100) is True  # parking twice is harmless
    resume_process(again, 100)
    assert again.state(100) == "running"


def test_illegal_steps_are_refused_like_the_driver_does(tmp_path):
    b, _ = virtual(tmp_path)
    with pytest.raises(ParkingError, match="checkpoint of process 100: it is running"):
        b.checkpoint(100)
    with pytest.raises(ParkingError, match="restore"):
        b.restore(100)


def test_a_failed_checkpoint_leaves_the_process_running(tmp_path):
    b, _ = virtual(tmp_path)

    def broken(pid):
        raise ParkingError("checkpoint failed: CUDA_ERROR_NOT_SUPPORTED")

    b.checkpoint = broken
    with pytest.raises(ParkingError):
        park_process(b, 100)
    assert b.state(100) == "running"  # unlocked again, not frozen


def test_remap_reaches_the_backend(tmp_path):
    b, _ = virtual(tmp_path)
    park_process(b, 101)
    b.restore(101, {"GPU-old": "GPU-new"})
    assert b.remapped(101) == {"GPU-old": "GPU-new"}


@pytest.mark.parametrize("pid", [0, -1, True, "12", 1 << 30])
def test_hostile_pids_are_refused(tmp_path, pid):
    b, _ = virtual(tmp_path)
    with pytest.raises(ParkingError):
        b.state(pid)


def test_uuid_parsing():
    assert uuid_bytes("GPU-00112233-4455-6677-8899-aabbccddeeff") == bytes(range(0, 256, 17))
    for bad in ("GPU-xyz", "GPU-0011", ""):
        with pytest.raises(ParkingError):
            uuid_bytes(bad)


def test_the_real_backend_is_imported_only_when_asked_for(tmp_path):
    make_backend("virtual", str(tmp_path))
    assert "cuda.bindings" not in sys.modules
    with pytest.raises(ValueError):
        make_backend("criu")


def test_a_record_about_an_earlier_process_with_the_same_pid_is_ignored(tmp_path):
    import json
    import os

    b = VirtualParking(tmp_path, has_context=lambda pid: True, sleep=lambda s: None)
    me = os.getpid()
    park_process(b, me)
    assert b.state(me) == "checkpointed"
    record = json.loads((tmp_path / f"{me}.json").read_text())
    (tmp_path / f"{me}.json").write_text(json.dumps({**record, "started": record["started"] - 1}))
    assert b.state(me) == "running"  # the pid was reused: this process was never parked


def test_parking_is_off_with_mps_and_says_why(tmp_path):
    """The driver refuses to lock an MPS client (CUDA_ERROR_NOT_SUPPORTED, seen on an H100 with
    driver 580 in tests/test_gpu_real.py): with MPS configured the hub turns parking off at start
    with the reason, instead of failing at every idle workspace."""
    from traitlets.config import Config

    from gpupool.parking.service import build_parking

    c = Config()
    c.GPUParking.backend = "cuda"
    c.GPUPool.mps_pipe_directory = "/tmp/nvidia-mps"
    with pytest.raises(ParkingError, match="cannot checkpoint CUDA MPS clients.*culled, not parked"):
        build_parking(c, pool=None, state_folder=str(tmp_path))
