"""Parking on a real hub with one virtual GPU: the culler parks an idle workspace (its kernel
checkpointed by the virtual backend, its share released), another user spawns on the freed
GPU, the first user's resume waits and says who holds the GPU, and completes once it frees.
Culler time is travelled; the hub's grant pass runs every 0.3 s."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from gpupool.idle_culler.config import IdleCuller
from gpupool.idle_culler.sampler import FileSampler
from gpupool.idle_culler.service import Client, Culler, service_definition
from gpupool.widgets.status import status_rows
from gpupool.widgets.summary import summary
from tests.hubtools import PASSWORD, Hub, WebUser
from tests.support.wait import until
from tests.test_containment import devices_enforced, expected, workspace_opens

pytestmark = pytest.mark.hub
TOKEN = "test-culler-token-0123456789abcdef"
_, ROLE = service_definition("test-culler", "", {"park_after_s": 600})
CONFIG = f"""
c.JupyterHub.services.append({{"name": "test-culler", "api_token": "{TOKEN}"}})
c.JupyterHub.load_roles.append({json.dumps({**ROLE, "name": "test-culler", "services": ["test-culler"]})})
c.GPUPool.virtual_gpus = 1
c.GPUParking.virtual_fixed_s = 0.05
c.GPUParking.virtual_per_gib_s = 0.0
c.GPUParking.grant_interval_s = 0.3
c.GPUParking.resume_wait_s = 60
"""


def test_park_another_user_spawns_resume_waits_then_completes(make_hub, tmp_path: Path) -> None:
    hub: Hub = make_hub(CONFIG, env={"GPUPOOL_CULLER": "0"}).start()  # this test drives the culler
    hub.spawn("ann", "1")
    ann = hub.user_token("ann")
    kernel = hub.api("POST", "/user/ann/api/kernels", {"name": "python3"}, token=ann)
    samples = tmp_path / "samples.json"
    samples.write_text(json.dumps({"ann/": {"util_pct": 0}}))
    cfg = IdleCuller(
        sampler="file",
        park_after_s=600,
        idle_limit_s=1800,
        jupyter_idle_s=900,
        window_s=30,
        stale_after_s=900,
        max_age_s=10**6,
    )
    t0 = time.time()
    now = [t0]
    culler = Culler(
        cfg,
        Client(TOKEN),
        f"{hub.url}/hub/api",
        f"http://127.0.0.1:{hub.api_port}/services/gpupool/",
        FileSampler(str(samples)),
        clock=lambda: now[0],
    )
    status_path = "/services/gpupool/api/parking/status?server="

    for minutes in (0, 5):
        now[0] = t0 + minutes * 60
        assert culler.run_pass()["events"] == []
    now[0] = t0 + 11 * 60
    events = culler.run_pass()["events"]
    assert [(e["kind"], e["owner"]) for e in events] == [("park", "ann")]

    # ann's share is free, the notebook server and its kernel still run
    status = hub.api("GET", status_path, token=ann)
    assert status["state"] == "parked"
    assert status["message"] == "GPU parked — it comes back when you run a cell"
    assert not [s for s in hub.allocations() if s["owner"] == "ann"]
    assert [k["id"] for k in hub.api("GET", "/user/ann/api/kernels", token=ann)] == [kernel["id"]]
    parked = {p.name: json.loads(p.read_text())["state"] for p in (hub.state / "parking").glob("*.json")}
    assert list(parked.values()) == ["checkpointed"]  # the kernel, not the server: it has no CUDA context
    if devices_enforced():  # a parked share holds no GPU: nothing of ann's workspace opens one
        assert workspace_opens(hub, "ann") == expected(set())
    parked_share_is_shown_as_the_quota_counts_it(hub, ann)
    # the culler's next pass sees a parked workspace: kept, not stopped for GPU idleness
    now[0] = t0 + 60 * 60
    report = culler.run_pass()
    assert [(w["owner"], w["action"], w["parked"]) for w in report["workspaces"]] == [
        ("ann", "keep", "GPU parked — it comes back when you run a cell")
    ]

    # another user spawns on the freed GPU
    hub.spawn("ben", "1")
    assert [s["owner"] for s in hub.allocations()] == ["ben"]

    # ann runs a cell (the hook's claim): she waits, and is told who holds the GPU
    waiting = hub.api("POST", "/services/gpupool/api/parking/resume", {"server": ""}, token=ann)
    assert waiting["state"] == "waiting" and waiting["position"] == 1
    assert "another user's workspace (1 GPU)" in waiting["message"]
    assert hub.api("GET", status_path, token=ann)["state"] == "waiting"
    hub.stop_server("ben")
    freed = time.monotonic()
    resumed = until(
        lambda: hub.api("GET", status_path, token=ann)["state"] == "running", "ann's workspace resumed"
    )
    assert resumed and time.monotonic() - freed < 10
    assert [s["owner"] for s in hub.allocations()] == ["ann"]
    if devices_enforced():  # resumed: its GPU opens again (allowed before the restore)
        assert workspace_opens(hub, "ann") == expected({0})
    parked = {p.name: json.loads(p.read_text())["state"] for p in (hub.state / "parking").glob("*.json")}
    assert list(parked.values()) == ["running"]
    events = hub.api("GET", "/services/gpupool/api/events?kind=resume")["events"]
    assert events and "resumed after" in events[0]["message"]


def test_users_park_and_resume_only_their_own_workspaces(make_hub) -> None:
    hub: Hub = make_hub(CONFIG, env={"GPUPOOL_CULLER": "0"}).start()
    hub.spawn("cat", "0.5")
    dan = hub.user_token("dan")
    code, message = hub.api_error(
        "POST", "/services/gpupool/api/parking/park", {"owner": "cat", "server": ""}, token=dan
    )
    assert code == 403
    code, _ = hub.api_error("POST", "/services/gpupool/api/parking/park", {"server": ["x"]}, token=dan)
    assert code == 400
    code, message = hub.api_error("POST", "/services/gpupool/api/parking/resume", {"server": ""}, token=dan)
    assert code == 404 and "no GPU workspace" in message
    cat = hub.user_token("cat")
    parked = hub.api("POST", "/services/gpupool/api/parking/park", {"server": ""}, token=cat)
    assert parked["state"] == "parked"
    # the JupyterLab item's Resume button posts to api/culler/resume: the same claim
    back = hub.api("POST", "/services/gpupool/api/culler/resume", {"server": ""}, token=cat)
    assert back["state"] in ("resuming", "running")
    until(
        lambda: (
            hub.api("GET", "/services/gpupool/api/parking/status?server=", token=cat)["state"] == "running"
        ),
        "cat's workspace resumed",
    )


def test_a_parked_workspace_survives_kill_9_of_the_hub(make_hub) -> None:
    hub: Hub = make_hub(CONFIG, env={"GPUPOOL_CULLER": "0"}).start()
    hub.spawn("eve", "1")
    eve = hub.user_token("eve")
    hub.api("POST", "/user/eve/api/kernels", {"name": "python3"}, token=eve)
    assert (
        hub.api("POST", "/services/gpupool/api/parking/park", {"server": ""}, token=eve)["state"] == "parked"
    )
    hub.kill9()
    hub.start()
    status_path = "/services/gpupool/api/parking/status?server="
    # the restart reconciled: the server still runs, so its claim is kept and its share stays free
    assert hub.api("GET", status_path, token=eve)["state"] == "parked"
    assert hub.allocations() == []
    states = [json.loads(p.read_text())["state"] for p in (hub.state / "parking").glob("*.json")]
    assert states == ["checkpointed"]
    hub.api("POST", "/services/gpupool/api/parking/resume", {"server": ""}, token=eve)
    until(lambda: hub.api("GET", status_path, token=eve)["state"] == "running", "eve's workspace resumed")
    assert [s["owner"] for s in hub.allocations()] == ["eve"]


def parked_share_is_shown_as_the_quota_counts_it(hub: Hub, ann: str) -> None:
    """ann's parked 1 GPU still counts against her 1 GPU quota (a second server is refused for
    it), so every screen says so: before, the form said "in use: 0 GPU; workspaces 0 of 2" and
    offered 1 GPU, `%gpupool` said "0 GPU of 1 GPU in use", the home page lost the server."""
    me = hub.api("GET", "/services/gpupool/api/me", token=ann)
    assert me["holdings"] == [{"server": "", "milli": 1000, "parked": True, "memory_killed": ""}]
    pool = hub.api("GET", "/services/gpupool/api/pool", token=ann)
    assert ("Build quota", "1 GPU of 1 GPU in use") in status_rows(me, pool, {}, "")  # %gpupool
    assert ("Share", "1 GPU, parked: it comes back when you run a cell") in status_rows(me, pool, {}, "")
    bar = summary(me, pool, None, "", time.time())  # the status bar's endpoint
    assert bar["share"] == "1" and bar["parked"]
    web = WebUser(hub.url, "ann")
    web.log_in(PASSWORD)
    _, _, form = web.get("/hub/spawn/ann/second")
    assert 'in use: <b>1 GPU</b>; workspaces <b class="gpupool-workspaces">1 of 2</b>' in form, form
    assert "<li>your default server (parked): 1 GPU</li>" in form
    assert "No size fits your quota now" in form
    _, _, home = web.get("/hub/home")
    assert '"name": "", "share": "1 GPU (parked)"' in home or '"share": "1 GPU (parked)"' in home, home
