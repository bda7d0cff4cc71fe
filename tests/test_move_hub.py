"""Moving an idle notebook on a real hub with two virtual GPUs (the virtual parking backend).

ann's and ben's notebooks hold half a GPU each, on different GPUs; a training job of the
project "own" (guarantee: one GPU) waits for a whole one. The culler (driven by the test, its
samples from a file, its clock travelled) finds ann's GPU idle and ben's busy; the mover moves
ann's kernel onto ben's GPU — reserved first, parked, restored with its GPU UUID remapped, the
old GPU released — and the job starts on the GPU freed. ann's kernel is the same process, and
her status line says where it went and why. Then the crash matrix of a move: the hub killed
at each phase is restarted and holds every invariant."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pytest

from gpupool.hub.failpoints import EXIT_CODE
from gpupool.idle_culler.config import IdleCuller
from gpupool.idle_culler.sampler import FileSampler
from gpupool.idle_culler.service import Client, Culler, service_definition
from gpupool.widgets.summary import summary
from tests.hubtools import PASSWORD, Hub, WebUser, progress_messages
from tests.kernelcalls import run_code
from tests.test_build_first_form import size_option
from tests.test_containment import OPENS, devices_enforced, expected, gpu_nodes

pytestmark = pytest.mark.hub
TOKEN = "test-culler-token-0123456789abcdef"
_, ROLE = service_definition("test-culler", "", {})
CONFIG = f"""
c.JupyterHub.services.append({{"name": "test-culler", "api_token": "{TOKEN}"}})
c.JupyterHub.load_roles.append({json.dumps({**ROLE, "name": "test-culler", "services": ["test-culler"]})})
c.GPUPool.virtual_gpus = 2
c.GPUParking.virtual_fixed_s = 0.05
c.GPUParking.virtual_per_gib_s = 0.0
c.GPUParking.grant_interval_s = 0.3
c.GPUMover.enabled = True
c.GPUMover.interval_s = 0.3
c.GPUMover.head_wait_s = 0
c.GPUMover.rest_s = 0
c.TrainPool.tick_s = 0.3
c.TrainPool.grace_s = 2
c.TrainPool.projects = {{"own": {{"guarantee": 1}}}}
"""
J = "/services/gpupool/api/jobs"
WAITER = """
import os, time
while not os.path.exists("go"):
    time.sleep(0.05)
"""


def layout(hub: Hub) -> dict[str, list[tuple[str, int]]]:
    out: dict[str, list[tuple[str, int]]] = {}
    for s in hub.allocations():
        out.setdefault(s["owner"], []).append((s["kind"], s["gpu"]))
    return out


def set_up(hub: Hub) -> tuple[str, dict, dict]:
    """ann alone on GPU 0, ben on GPU 1 (half a GPU each), ann's kernel running, a job of one
    whole GPU queued; returns ann's token, her kernel and the job."""
    hub.spawn("cat", "0.5")
    hub.spawn("ann", "0.5")  # packed beside cat on GPU 0
    hub.spawn("ben", "0.5")  # GPU 1
    hub.stop_server("cat")
    assert layout(hub) == {"ann": [("build", 0)], "ben": [("build", 1)]}
    ann = hub.user_token("ann")
    kernel = hub.api("POST", "/user/ann/api/kernels", {"name": "python3"}, token=ann)
    job = hub.api(
        "POST",
        J,
        {"project": "own", "gpus": 1, "name": "gang", "script": WAITER},
        token=hub.user_token("dan"),
    )
    assert hub.api("GET", f"{J}/{job['id']}", token=hub.user_token("dan"))["state"] == "queued"
    return ann, kernel, job


def culler_says_ann_is_idle(hub: Hub, tmp: Path) -> None:
    """Two passes of the real culler, five minutes apart (travelled): ann's GPU idle, ben's busy."""
    samples = tmp / f"samples-{hub.api_port}.json"
    samples.write_text(json.dumps({"ann/": {"util_pct": 0}, "ben/": {"util_pct": 80}}))
    cfg = IdleCuller(sampler="file", park_after_s=0, window_s=30, stale_after_s=900, max_age_s=10**6)
    now = [time.time()]
    culler = Culler(
        cfg,
        Client(TOKEN),
        f"{hub.url}/hub/api",
        f"http://127.0.0.1:{hub.api_port}/services/gpupool/",
        FileSampler(str(samples)),
        clock=lambda: now[0],
    )
    culler.run_pass()
    now[0] += 300
    found = {w["owner"]: w for w in culler.run_pass()["workspaces"]}
    assert found["ann"]["gpu_idle_s"] == 300 and found["ben"]["gpu_idle_s"] == 0


def kernel_state(hub: Hub) -> dict[str, dict]:
    """The virtual driver's record of every kernel process it parked (state, last remap)."""
    return {p.stem: json.loads(p.read_text()) for p in (hub.state / "parking").glob("*.json")}


def test_an_idle_notebook_moves_to_make_room_for_a_training_job(make_hub, tmp_path: Path) -> None:
    hub: Hub = make_hub(CONFIG, env={"GPUPOOL_CULLER": "0"}).start()
    ann, kernel, job = set_up(hub)
    dan = hub.user_token("dan")
    culler_says_ann_is_idle(hub, tmp_path)
    running = hub.wait_job(job["id"], {"running"}, dan, timeout=60)
    assert layout(hub) == {"ann": [("build", 1)], "ben": [("build", 1)], "dan": [("train", 0)]}
    # ann's kernel is the same process, running, restored with GPU 0's UUID mapped to GPU 1's
    assert [k["id"] for k in hub.api("GET", "/user/ann/api/kernels", token=ann)] == [kernel["id"]]
    [record] = kernel_state(hub).values()
    assert record["state"] == "running" and record["remapped"] == {"GPU-virtual-0": "GPU-virtual-1"}
    [event] = hub.api("GET", "/services/gpupool/api/events?kind=move")["events"]
    assert event["message"] == "build ann/default moved from GPU 0 to GPU 1 to make room for a training job"
    status = hub.api("GET", "/services/gpupool/api/parking/status?server=", token=ann)
    assert status["state"] == "running"
    # what ann reads: %gpupool's rows and the JupyterLab status bar (her server's own endpoint)
    at = time.strftime("%H:%M", time.localtime(event_time(event)))
    said = f"moved to GPU 1 at {at} (to make room for a training job)"
    lab = hub.api("GET", "/user/ann/gpupool/status", token=ann)
    assert lab["moved"] == said and f"{said}: nothing restarted" in lab["lines"]
    me, pool = (hub.api("GET", f"/services/gpupool/api/{p}", token=ann) for p in ("me", "pool"))
    from gpupool.widgets.status import status_rows

    assert ("Moved", f"{said}: nothing restarted") in status_rows(me, pool, {}, "")
    assert summary(me, pool, None, "", time.time())["moved"] == said
    # what runs on a GPU from now on runs on GPU 1: a kernel started after the move (its launch
    # environment and its Python), and what the moved kernel starts (a shell, like `!nvidia-smi`)
    assert sees_gpu(hub, ann, kernel["id"], shell=True) == "1"
    if devices_enforced():  # the moved kernel itself may open GPU 1's device node, no more GPU 0's
        assert kernel_opens(hub, ann, kernel["id"]) == expected({1})
    fresh = hub.api("POST", "/user/ann/api/kernels", {"name": "python3"}, token=ann)
    assert sees_gpu(hub, ann, fresh["id"]) == "1"
    assert launched_with(hub, ann, fresh["id"])["CUDA_VISIBLE_DEVICES"] == "1"
    assert launched_with(hub, ann, fresh["id"])["GPUPOOL_GPU_UUIDS"] == "GPU-virtual-1"
    Path(running["workdir"], "go").touch()
    hub.wait_job(job["id"], {"succeeded"}, dan)


def sees_gpu(hub: Hub, token: str, kernel_id: str, shell: bool = False) -> str:
    """CUDA_VISIBLE_DEVICES as a kernel's cell sees it (or a shell the cell starts)."""
    code = (
        (
            "import subprocess; print(subprocess.check_output('echo $CUDA_VISIBLE_DEVICES', shell=True,"
            " text=True).strip())"
        )
        if shell
        else "import os; print(os.environ['CUDA_VISIBLE_DEVICES'])"
    )
    return run_code(hub, "ann", token, kernel_id, code).strip()


def kernel_opens(hub: Hub, token: str, kernel_id: str) -> list[str]:
    """What ann's kernel process gets opening /dev/nvidia0..3 look-alikes (EPERM: its devices
    cgroup refused; ENXIO: allowed, no driver), after widening CUDA_VISIBLE_DEVICES itself."""
    import shutil
    import tempfile

    folder = Path(tempfile.mkdtemp(prefix="gpupool-devs-"))
    try:
        folder.chmod(0o755)
        gpu_nodes(folder)
        code = f"import sys; sys.argv = ['opens', {str(folder)!r}]; exec({OPENS!r}, {{}})"
        return run_code(hub, "ann", token, kernel_id, code).split("opens: ", 1)[1].split()
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def launched_with(hub: Hub, token: str, kernel_id: str) -> dict[str, str]:
    """The environment the server launched a kernel with (what a kernel of any language gets)."""
    pid = int(run_code(hub, "ann", token, kernel_id, "import os; print(os.getpid())"))
    pairs = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    return dict(p.decode().split("=", 1) for p in pairs if b"=" in p)


def event_time(event: dict) -> float:
    from datetime import UTC, datetime

    return datetime.fromisoformat(event["time"].removesuffix("Z")).replace(tzinfo=UTC).timestamp()


@pytest.mark.parametrize("point", ["move.reserved", "move.parked", "move.restored"])
def test_a_hub_killed_at_each_phase_of_a_move_restarts_with_every_invariant_held(
    make_hub, tmp_path: Path, point: str
) -> None:
    hub: Hub = make_hub(CONFIG, env={"GPUPOOL_CULLER": "0", "GPUPOOL_FAILPOINT": point}).start()
    ann, kernel, job = set_up(hub)
    dan = hub.user_token("dan")
    try:
        culler_says_ann_is_idle(hub, tmp_path)
    except Exception:  # noqa: BLE001 - the hub may die while the culler reports
        pass
    assert hub.proc.wait(60) == EXIT_CODE, hub.tail()  # died exactly at the point
    del hub.env["GPUPOOL_FAILPOINT"]
    hub.start()

    # no GPU over-allocated, ann holds one share (no leftover reservation), her kernel runs
    shares = hub.allocations()
    per_gpu: dict[int, int] = {}
    for s in shares:
        per_gpu[s["gpu"]] = per_gpu.get(s["gpu"], 0) + s["milli"]
    assert all(v <= 1000 for v in per_gpu.values()), shares
    moved = point != "move.reserved"  # once parked, a move is finished forward
    assert layout(hub)["ann"] == [("build", 1 if moved else 0)]
    if devices_enforced():  # its kernel opens the GPU it holds now, not the other end of the move
        assert kernel_opens(hub, ann, kernel["id"]) == expected({1 if moved else 0})
    assert [k["id"] for k in hub.api("GET", "/user/ann/api/kernels", token=ann)] == [kernel["id"]]
    records = list(kernel_state(hub).values())
    assert all(r["state"] == "running" for r in records)
    if moved:
        assert records[0]["remapped"] == {"GPU-virtual-0": "GPU-virtual-1"}
    end = "move" if moved else "move-aborted"
    assert hub.api("GET", f"/services/gpupool/api/events?kind={end}")["events"]
    assert hub.api("GET", "/services/gpupool/api/parking/status?server=", token=ann)["state"] == "running"
    # the queue is not wedged: with the culler's findings again, the job starts
    culler_says_ann_is_idle(hub, tmp_path)
    running = hub.wait_job(job["id"], {"running"}, dan, timeout=60)
    assert layout(hub)["ann"] == [("build", 1)]
    Path(running["workdir"], "go").touch()
    hub.wait_job(job["id"], {"succeeded"}, dan)


def test_a_large_workspace_waits_while_an_idle_notebook_moves_then_starts(make_hub, tmp_path: Path) -> None:
    """dan asks for a whole GPU; each GPU holds half of one (ann idle, ben busy). The form offers
    the size and says what it takes; the spawn page says what it waits for; ann's kernel moves
    beside ben's; dan's server starts on the GPU freed."""
    hub: Hub = make_hub(CONFIG + "c.GPUParking.virtual_fixed_s = 1.5\n", env={"GPUPOOL_CULLER": "0"}).start()
    hub.spawn("cat", "0.5")
    hub.spawn("ann", "0.5")
    hub.spawn("ben", "0.5")
    hub.stop_server("cat")
    ann = hub.user_token("ann")
    kernel = hub.api("POST", "/user/ann/api/kernels", {"name": "python3"}, token=ann)
    culler_says_ann_is_idle(hub, tmp_path)

    dan = WebUser(hub.url, "dan")
    dan.log_in(PASSWORD)
    _, _, form = dan.get("/hub/spawn/dan")
    one = size_option(form, "1")
    assert "disabled" not in one and "starting it first moves 1 idle notebook to another GPU" in one, one

    spawn = threading.Thread(target=hub.spawn, args=("dan", "1"), kwargs={"wait": False})
    spawn.start()
    said = progress_messages(hub, "dan")
    spawn.join()
    assert any(
        m.startswith("Making room for 1 GPU: 1 idle notebook of other users moves to another GPU")
        for m in said
    ), said
    hub.wait_ready("dan")
    assert layout(hub) == {"ann": [("build", 1)], "ben": [("build", 1)], "dan": [("build", 0)]}
    assert [k["id"] for k in hub.api("GET", "/user/ann/api/kernels", token=ann)] == [kernel["id"]]
    [record] = kernel_state(hub).values()
    assert record["state"] == "running" and record["remapped"] == {"GPU-virtual-0": "GPU-virtual-1"}
    [event] = hub.api("GET", "/services/gpupool/api/events?kind=move")["events"]
    assert event["message"] == "build ann/default moved from GPU 0 to GPU 1 to make room for a new workspace"
