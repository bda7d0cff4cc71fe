"""GPU shares on a real NVIDIA GPU (marked `gpu`; skipped where NVML finds none).

What a user on a fraction notices, measured on the card itself rather than on the fake NVML:
* a workspace's PyTorch gets about its share of memory and no more, and two workspaces on one
  card both run (the sitecustomize cap, through the environment `gpu_env` renders);
* the culler's NVML sampler tells a busy workspace from an idle one, through the server's
  process tree, and sees the memory an idle one still holds;
* with an MPS control daemon, a workspace's SMs and memory are limited by MPS at its share.
The hardware samples over real time, so these tests wait for it (seconds); no gpupool logic
here depends on the clock.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import pytest

from gpupool.gpu.env import gpu_env
from gpupool.gpu.nvml import discover_gpus
from gpupool.idle_culler.policy import Limits
from gpupool.idle_culler.sampler import NVMLSampler, Target

GPUS = discover_gpus()
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not GPUS, reason="no NVIDIA GPU with NVML here")]
torch = pytest.importorskip("torch") if GPUS else None

# Allocates `fit` of its share, then `more` on top; reports what the card and torch said.
ALLOCATE = textwrap.dedent("""
    import json, os, sys, torch
    share_mib = int(os.environ["GPUPOOL_GPU_MEMORY_MIB"])
    fit, more = float(sys.argv[1]), float(sys.argv[2])
    free, total = torch.cuda.mem_get_info()
    out = {"total_mib": total >> 20, "sms": torch.cuda.get_device_properties(0).multi_processor_count}
    def grab(frac):
        try:
            return torch.empty(int(frac * share_mib) << 20, dtype=torch.uint8, device="cuda")
        except torch.OutOfMemoryError as err:
            return str(err).splitlines()[0]
    a = grab(fit)
    out["fit"] = a if isinstance(a, str) else "ok"
    b = grab(more)
    out["more"] = b if isinstance(b, str) else "ok"
    x = torch.randn(4096, 4096, device="cuda")
    for _ in range(int(sys.argv[3]) if len(sys.argv) > 3 else 0):
        x = torch.tanh(x @ x)
    torch.cuda.synchronize()
    print(json.dumps(out), flush=True)
""")

# Busy while the flag file exists, then idle holding 1 GiB until stdin closes.
BUSY_THEN_IDLE = textwrap.dedent("""
    import os, sys, torch
    flag = sys.argv[1]
    hold = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
    x = torch.randn(8192, 8192, device="cuda")
    print("ready", flush=True)
    while os.path.exists(flag):
        for _ in range(20):
            x = torch.tanh(x @ x)
        torch.cuda.synchronize()
    print("idle", flush=True)
    sys.stdin.read()
""")


def _share_env(milli: int, mps_dir: str = "", torch_cap: bool = True) -> dict[str, str]:
    env = {**os.environ, **gpu_env([GPUS[0]], milli, mps_pipe_directory=mps_dir)}
    if not torch_cap:
        env["GPUPOOL_TORCH_CAP"] = "0"
    return env


def _allocate(
    milli: int, fit: float, more: float, loops: int = 0, mps_dir: str = "", torch_cap: bool = True
) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-c", ALLOCATE, str(fit), str(more), str(loops)],
        env=_share_env(milli, mps_dir, torch_cap),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _result(proc: subprocess.Popen) -> dict:
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err
    return json.loads(out.strip().splitlines()[-1])


def test_a_quarter_share_gets_its_memory_and_no_more() -> None:
    r = _result(_allocate(250, 0.9, 0.3))
    assert r["fit"] == "ok"  # 90 % of the share is there for the user
    assert r["more"] != "ok" and "out of memory" in r["more"].lower(), r  # 120 % is refused by torch's cap
    print(
        f"0.25 share on a {r['total_mib']} MiB card: 90 % of the share allocated, 120 % refused: "
        f"{r['more'][:120]}"
    )


def test_two_half_shares_run_side_by_side_on_one_card() -> None:
    a, b = _allocate(500, 0.9, 0.1, loops=200), _allocate(500, 0.9, 0.1, loops=200)
    ra, rb = _result(a), _result(b)
    # both hold 90 % of half the card and compute at once; neither can take more than its half
    assert ra["fit"] == rb["fit"] == "ok", (ra, rb)
    assert ra["more"] != "ok" and rb["more"] != "ok", (ra, rb)


def _start_server(env: dict[str, str]) -> tuple[subprocess.Popen, Path]:
    """A 'server' shell whose child is the GPU process, as a workspace's kernel is (the `exit`
    after it keeps bash from exec-ing python in its place)."""
    flag = Path(tempfile.mkdtemp()) / "busy"
    flag.touch()
    shell = subprocess.Popen(
        ["bash", "-c", f'"{sys.executable}" -c "$0" "$1"; exit $?', BUSY_THEN_IDLE, str(flag)],
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert shell.stdout.readline().strip() == "ready"
    return shell, flag


@pytest.fixture
def server():
    shell, flag = _start_server(_share_env(1000))
    yield shell, flag
    shell.stdin.close()
    shell.wait(timeout=60)


def _sample(sampler: NVMLSampler, target: Target, settle_s: float):
    sampler.sample([target])  # moves NVML's "since" timestamp to now
    time.sleep(settle_s)
    return sampler.sample([target]).get(target.key)


def test_sampler_tells_a_busy_workspace_from_an_idle_one(server) -> None:
    shell, flag = server
    sampler = NVMLSampler()
    mine = Target("alice", "", pid=shell.pid, gpu_uuids=(GPUS[0].uuid,))
    whole = Target("alice", "whole", pid=shell.pid, gpu_uuids=(GPUS[0].uuid,), whole_gpus=True)
    busy = _sample(sampler, mine, 3)
    busy_whole = sampler.sample([whole]).get(whole.key)
    assert busy is not None, "NVML gave no per-process data for a busy workspace"
    assert busy.util_pct >= 50 and busy.memory_mib >= 1024, busy
    assert busy_whole is not None and busy_whole.util_pct >= 50, busy_whole
    flag.unlink()
    assert shell.stdout.readline().strip() == "idle"
    # one reading a second, as a culler pass would take them: the tail of the busy period may
    # still show, but an idle workspace must read below the culler's default threshold soon
    # and stay there, or the default would never cull anyone on real hardware
    sampler.sample([mine])
    readings = []
    for _ in range(12):
        time.sleep(1)
        readings.append(sampler.sample([mine])[mine.key])
    print(
        f"NVML sampler: busy {busy.util_pct} % SM / {busy.memory_mib} MiB (whole-GPU view "
        f"{busy_whole.util_pct} %); idle, one reading a second: {[u.util_pct for u in readings]} %"
    )
    assert all(u.memory_mib >= 1024 for u in readings), readings  # idle, still holding its memory
    assert max(u.util_pct for u in readings[-8:]) < Limits().util_threshold_pct, readings


@pytest.fixture
def mps_daemon():
    control = shutil.which("nvidia-cuda-mps-control")
    if control is None:
        pytest.skip("no nvidia-cuda-mps-control on this machine")
    pipe = tempfile.mkdtemp(prefix="mps-pipe-")
    env = {**os.environ, "CUDA_MPS_PIPE_DIRECTORY": pipe, "CUDA_MPS_LOG_DIRECTORY": tempfile.mkdtemp()}
    subprocess.run([control, "-d"], env=env, check=True, timeout=30)
    yield pipe
    subprocess.run([control], input="quit\n", env=env, text=True, timeout=30)


def test_mps_limits_a_quarter_share_to_its_sms_and_memory(mps_daemon) -> None:
    full_sms = torch.cuda.get_device_properties(0).multi_processor_count
    with_cap = _result(_allocate(250, 0.9, 0.3, loops=10, mps_dir=mps_daemon))
    # and with the torch cap switched off, so that MPS alone must hold the line
    mps_only = _result(_allocate(250, 0.9, 0.3, loops=10, mps_dir=mps_daemon, torch_cap=False))
    share_mib = _share_env(250)["GPUPOOL_GPU_MEMORY_MIB"]
    for name, r in (("torch cap + MPS", with_cap), ("MPS alone", mps_only)):
        print(
            f"under MPS at 0.25 ({name}): {r['sms']} of {full_sms} SMs, share {share_mib} MiB; "
            f"90 %: {r['fit']}; 120 %: {r['more'][:160]}"
        )
        assert r["fit"] == "ok", r  # the user gets the share MPS pins, not a share of the share
        assert r["more"] != "ok", r  # 120 % of the share is refused
        assert r["sms"] <= full_sms * 0.3, r  # the active-thread percentage shows as a quarter of the SMs


def test_parking_a_busy_workspace_frees_its_memory_and_it_goes_on_after_resume(server) -> None:
    """The hub parks every process of a server that holds a CUDA context (the shell has none),
    even while kernels are running: the lock waits for them; the card's memory comes back."""
    from gpupool.gpu.cuda_checkpoint import CudaCheckpoint
    from gpupool.gpu.nvml import NVML
    from gpupool.gpu.parking import park_process, resume_process
    from gpupool.gpu.proctree import descendants

    shell, flag = server
    backend, nvml = CudaCheckpoint(), NVML()
    nvml.open()

    def used_mib() -> int:
        return nvml.device_samples()[0].memory_used_mib

    before = used_mib()
    pids = sorted(descendants(shell.pid))
    parked = {pid: park_process(backend, pid, lock_timeout_ms=10_000) for pid in pids}  # busy right now
    assert parked[shell.pid] is False  # no CUDA context: left alone
    workers = [pid for pid, done in parked.items() if done]
    assert len(workers) == 1 and backend.state(workers[0]) == "checkpointed"
    freed = before - used_mib()
    held = {p.pid for p in nvml.process_samples()}
    assert freed >= 1024 and workers[0] not in held, (before, freed, held)
    for pid in workers:
        resume_process(backend, pid)
    assert backend.state(workers[0]) == "running"
    flag.unlink()  # the loop it was in finishes after the restore, then it idles
    assert shell.stdout.readline().strip() == "idle"
    assert used_mib() >= before - 64
    print(f"parked a busy workspace: {freed} MiB freed on the card; resumed, its loop went on")


def test_parking_an_mps_client_parks_it_or_leaves_it_running(mps_daemon) -> None:
    """Under MPS the context lives in the MPS server. Whatever the driver does, the workspace must
    end either parked and restorable, or refused with its process running and usable."""
    from gpupool.gpu.cuda_checkpoint import CudaCheckpoint
    from gpupool.gpu.parking import ParkingError, park_process, resume_process
    from gpupool.gpu.proctree import descendants

    shell, flag = _start_server(_share_env(250, mps_daemon))
    backend = CudaCheckpoint()
    try:
        worker = max(descendants(shell.pid))
        try:
            parked = park_process(backend, worker, lock_timeout_ms=10_000)
            outcome = f"parked={parked}, state {backend.state(worker)}"
            if parked:
                resume_process(backend, worker)
        except ParkingError as err:
            outcome = f"refused: {err}"
        print(f"parking an MPS client: {outcome}; state now {backend.state(worker)}")
        assert backend.state(worker) in ("running", "none")  # never left locked or checkpointed
        flag.unlink()
        assert shell.stdout.readline().strip() == "idle"  # and its work went on
    finally:
        shell.stdin.close()
        shell.wait(timeout=60)
