"""The culler against a real hub: GPU use from a file standing in for NVML, time travelled
through the culler's clock and the hub's activity API — no sleeping."""

from __future__ import annotations

import datetime as dt
import json
import time
from pathlib import Path

import pytest

from idle_culler.config import IdleCuller
from idle_culler.sampler import FileSampler
from idle_culler.service import Client, Culler, service_definition
from tests.hubtools import Hub

pytestmark = pytest.mark.hub
TOKEN = "test-culler-token-0123456789abcdef"
_, ROLE = service_definition("test-culler", "")
CONFIG = f"""
c.JupyterHub.services.append({{"name": "test-culler", "api_token": "{TOKEN}"}})
c.JupyterHub.load_roles.append({json.dumps({**ROLE, "name": "test-culler", "services": ["test-culler"]})})
"""


def iso(t: float) -> str:
    return dt.datetime.fromtimestamp(t, dt.UTC).isoformat().replace("+00:00", "Z")


def test_culler_warns_culls_idle_gpus_and_spares_busy_exempt_and_unmeasured(make_hub, tmp_path: Path) -> None:
    hub: Hub = make_hub(CONFIG, env={"GPUPOOL_CULLER": "0"}).start()  # this test drives the passes
    for user in ("idle1", "busy1", "nodata1", "admin"):
        hub.spawn(user, "0.25")
    samples = tmp_path / "samples.json"
    samples.write_text(json.dumps({"idle1/": {"util_pct": 0}, "busy1/": {"util_pct": 85, "memory_mib": 900},
                                   "admin/": {"util_pct": 0}}))  # nodata1: NVML has nothing on it
    cfg = IdleCuller(sampler="file", idle_limit_s=1800, jupyter_idle_s=600, warn_before_s=600, max_age_s=2400,
                     extension_s=600, window_s=30, stale_after_s=900)
    t0 = time.time()
    now = [t0]
    culler = Culler(cfg, Client(TOKEN), f"{hub.url}/hub/api", f"http://127.0.0.1:{hub.api_port}/services/gpupool/",
                    FileSampler(str(samples)), clock=lambda: now[0])

    def at(minutes: int) -> dict:
        now[0] = t0 + minutes * 60
        # nodata1's owner is working in Jupyter (activity up to now, in travelled time)
        hub.api("POST", "/hub/api/users/nodata1/activity",
                {"servers": {"": {"last_activity": iso(now[0])}}})
        return culler.run_pass()

    def running() -> set[str]:
        return {s["owner"] for s in hub.allocations()}

    for m in range(0, 20, 5):
        assert at(m)["events"] == []
    warned = at(20)["events"]
    assert [(e["kind"], e["owner"], e["reason"]) for e in warned] == [("warn", "idle1", "idle-gpu")]
    # the owner sees the warning through the API the notebook widget reads
    status = hub.api("GET", "/services/gpupool/api/culler/status", token=hub.user_token("idle1"))
    assert [w["action"] for w in status["workspaces"]] == ["warn"]
    assert "will stop in 10 min because its GPU has been idle" in status["workspaces"][0]["message"]
    assert at(25)["events"] == []  # warned once, not every pass

    events = at(30)["events"]
    assert [(e["owner"], e["reason"]) for e in events if e["kind"] == "cull"] == [("idle1", "idle-gpu")]
    # the 40-minute session limit is now 10 minutes away for the others (not the exempt admin)
    assert {(e["owner"], e["reason"]) for e in events if e["kind"] == "warn"} == {
        ("busy1", "max-age"), ("nodata1", "max-age")}
    deadline = time.monotonic() + 30
    while "idle1" in running() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert running() == {"busy1", "nodata1", "admin"}  # busy GPU, no GPU data, exempt admin

    # busy1 asks for more time, once
    token = hub.user_token("busy1")
    hub.api("POST", "/services/gpupool/api/culler/extend", {"server": ""}, token=token)
    status, message = hub.api_error("POST", "/services/gpupool/api/culler/extend", {"server": ""}, token=token)
    assert status == 409 and "already extended once" in message

    events = at(40)["events"]  # the 40-minute session limit
    assert {(e["owner"], e["reason"]) for e in events if e["kind"] == "cull"} == {("nodata1", "max-age")}
    deadline = time.monotonic() + 30
    while "nodata1" in running() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert running() == {"busy1", "admin"}
    kinds = [e["kind"] for e in hub.api("GET", "/services/gpupool/api/events?kind=cull")["events"]]
    assert kinds == ["cull", "cull"]


def test_only_the_culler_service_may_report_or_list(hub: Hub) -> None:
    token = hub.user_token("eve")
    status, _ = hub.api_error("POST", "/services/gpupool/api/culler/report", {"workspaces": []}, token=token)
    assert status == 403
    status, _ = hub.api_error("GET", "/services/gpupool/api/culler/targets", token=token)
    assert status == 403
    status, message = hub.api_error("POST", "/services/gpupool/api/culler/extend", {"server": "x"}, token=token)
    assert status == 404 and "no running GPU workspace 'x' of eve" in message
