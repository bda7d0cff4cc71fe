"""Usage accounting and budgets on a real hub: api/usage (JSON, CSV, bounds, paging), budgets
refusing spawns and train jobs with the reason, admins' top-ups, the culler parking an idle GPU
of a user over budget while a busy one keeps its GPU, gauges on /hub/metrics, and the same
figures after a hub restart. Time travels by moving the allocations' start back in the state
database (the hub computes budgets from it on each request), and through the culler's clock."""

from __future__ import annotations

import json
import sqlite3
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from gpupool.idle_culler.config import IdleCuller
from gpupool.idle_culler.sampler import FileSampler
from gpupool.idle_culler.service import Client, Culler
from tests import dashboards
from tests.hubtools import ADMIN_TOKEN, Hub
from tests.support.wait import until
from tests.test_culler_hub import CONFIG, TOKEN

pytestmark = pytest.mark.hub
U = "/services/gpupool/api/usage"
USAGE_CONFIG = (
    CONFIG
    + """
c.Usage.budgets = {"students": {"gpu_hours": 1, "window_days": 1, "min_share": 0.1}}
c.Usage.prices = {"default": 2.0}
c.Usage.currency = "EUR"
c.TrainPool.projects = {"default": {"guarantee": 4}}
c.TrainPool.tick_s = 0.5
"""
)


def backdate(hub: Hub, owner: str, hours: float) -> None:
    """`owner`'s GPU shares were taken `hours` earlier than they were (travel in time)."""
    with sqlite3.connect(hub.state / "gpupool.sqlite", timeout=30) as db:
        db.execute(
            "UPDATE gpupool_allocations SET created = datetime(created, ?) WHERE owner = ?",
            (f"-{int(hours * 3600)} seconds", owner),
        )


def rows(report: dict) -> dict[str, dict]:
    return {r["key"]: r for r in report["rows"]}


def test_usage_budgets_and_parking_over_budget_on_a_real_hub(make_hub, tmp_path: Path) -> None:
    hub: Hub = make_hub(USAGE_CONFIG, env={"GPUPOOL_CULLER": "0"}).start()  # this test drives the culler
    for user in ("stu", "kim"):
        hub.api("POST", f"/hub/api/users/{user}")
    hub.api("POST", "/hub/api/groups/students")
    hub.api("POST", "/hub/api/groups/students/users", {"users": ["stu", "kim"]})
    stu = hub.user_token("stu")
    hub.spawn("stu", "0.5")
    hub.spawn("kim", "0.5")
    budget = hub.api("GET", "/services/gpupool/api/budget", token=stu)
    assert budget["status"] == "ok" and budget["budgets"][0]["target"] == "group:students"

    # 1.7 h on half a GPU: 0.85 of 1 GPU-h, near the limit: the user is told
    backdate(hub, "stu", 1.7)
    budget = hub.api("GET", "/services/gpupool/api/budget", token=stu)
    assert budget["status"] == "near" and "near the limit" in budget["message"]
    assert budget["budgets"][0]["used_gpu_hours"] == pytest.approx(0.85, abs=0.01)

    # 2.2 h: over. New work above the minimum share is refused with the reason; the minimum starts
    backdate(hub, "stu", 0.5)
    status, message = hub.api_error("POST", "/hub/api/users/stu/servers/more", {"gpus": 0.25})
    assert (
        status == 403 and "your GPU-hour budget (1 GPU-h per day (each member of group students))" in message
    )
    assert "is used up" in message and "a workspace of at most 0.1 GPU still starts" in message
    status, message = hub.api_error(
        "POST", "/services/gpupool/api/jobs", {"project": "default", "gpus": 1, "command": "true"}, token=stu
    )
    assert status == 403 and "a train job is refused: your GPU-hour budget" in message
    hub.spawn("stu", "0.1", server="tiny")
    hub.stop_server("stu", "tiny")
    assert {s["owner"] for s in hub.allocations()} == {"stu", "kim"}  # the running workspace keeps running

    # the culler: stu's idle GPU is parked; kim (over budget too) runs a cell: keeps the GPU
    backdate(hub, "kim", 2.5)
    samples = tmp_path / "samples.json"
    samples.write_text(
        json.dumps({"stu/": {"util_pct": 0, "memory_mib": 300}, "kim/": {"util_pct": 95, "memory_mib": 5000}})
    )
    now = [time.time()]
    culler = Culler(
        IdleCuller(sampler="file", window_s=30),
        Client(TOKEN),
        f"{hub.url}/hub/api",
        f"http://127.0.0.1:{hub.api_port}/services/gpupool/",
        FileSampler(str(samples)),
        clock=lambda: now[0],
    )
    targets = {t["owner"]: t for t in hub.api("GET", "/services/gpupool/api/culler/targets")["workspaces"]}
    assert targets["stu"]["budget"] == "park" and targets["kim"]["budget"] == "park"
    assert culler.run_pass()["events"] == []  # the first sample: no window seen idle yet
    now[0] += 31
    events = culler.run_pass()["events"]
    assert [(e["kind"], e["owner"], e["reason"]) for e in events] == [("park", "stu", "budget")]
    assert {s["owner"] for s in hub.allocations()} == {"kim"}  # stu's share went back; kim computes on
    assert hub.api("GET", "/services/gpupool/api/parking/status", token=stu)["state"] == "parked"
    assert hub.api("GET", "/hub/api/users/stu")["servers"][""]["ready"]  # the session itself is still there

    # an admin tops stu up: a train job is accepted again
    grant = hub.api(
        "POST",
        "/services/gpupool/api/budgets/grants",
        {"target": "user:stu", "kind": "topup", "gpu_hours": 5, "days": 1, "note": "deadline"},
    )
    assert grant["gpu_hours"] == 5
    assert hub.api("GET", "/services/gpupool/api/budget", token=stu)["status"] == "ok"
    job = hub.api(
        "POST", "/services/gpupool/api/jobs", {"project": "default", "gpus": 1, "command": "true"}, token=stu
    )
    assert job["state"] == "queued"
    status, _ = hub.api_error(
        "POST",
        "/services/gpupool/api/budgets/grants",
        {"target": "user:stu", "kind": "topup", "gpu_hours": 5},
        token=stu,
    )
    assert status == 403  # only admins
    admin_view = hub.api("GET", "/services/gpupool/api/budgets")
    assert [g["target"] for g in admin_view["grants"]] == ["user:stu"]
    assert {u["user"]: u["status"] for u in admin_view["users"]} == {"kim": "over", "stu": "ok"}

    # the report: per user and group, cost at the configured price, waste where measured
    report = hub.api("GET", f"{U}?period=24h&by=user&sort=allocated")
    r = rows(report)
    assert r["kim"]["allocated_gpu_hours"] == pytest.approx(1.25, abs=0.02)  # 0.5 GPU x 2.5 h
    assert r["stu"]["allocated_gpu_hours"] == pytest.approx(1.1, abs=0.02)
    assert r["stu"]["cost"] == pytest.approx(2.2, abs=0.05) and report["currency"] == "EUR"
    assert r["stu"]["measured_gpu_hours"] > 0 and r["stu"]["used_gpu_hours"] == 0  # its samples said 0 %
    assert r["stu"]["parked_hours"] >= 0 and report["rows"][0]["key"] == "kim"
    assert rows(hub.api("GET", f"{U}?period=24h&by=group"))["students"][
        "allocated_gpu_hours"
    ] == pytest.approx(2.35, abs=0.04)
    mine = hub.api("GET", f"{U}?period=7d&by=user", token=stu)
    assert set(rows(mine)) == {"stu"}  # a user sees only their own use
    series = hub.api("GET", f"{U}?period=24h&by=user&step=auto")["series"]
    assert series["step_s"] == 1800 and set(series["keys"]) == {"kim", "stu"}
    with urllib.request.urlopen(
        urllib.request.Request(
            f"{hub.url}{U}?period=24h&by=user&format=csv", headers={"Authorization": f"token {ADMIN_TOKEN}"}
        )
    ) as resp:
        assert resp.headers["Content-Type"].startswith("text/csv")
        lines = resp.read().decode().splitlines()
    assert lines[0].startswith("user,allocated_gpu_hours,") and len(lines) == 3
    for bad, why in (
        ("limit=0", "limit must be"),
        ("period=3w", "period must be one of"),
        ("from=2026-01-02&to=2026-01-01", "from must be before to"),
        ("by=colour", "by must be"),
        ("period=365d&step=60", "at most 500 buckets"),
        ("from=tomorrow", "from: a time"),
        ("offset=-1", "offset must be"),
        ("limit=1&limit=2", "given more than once"),
        ("colour=red", "unknown parameters"),
    ):
        status, message = hub.api_error("GET", f"{U}?{bad}")
        assert status == 400 and why in message, (bad, message)

    # gauges on the hub's own Prometheus endpoint: computed off the loop after the first scrape
    def scrape() -> str | None:
        with urllib.request.urlopen(
            urllib.request.Request(
                f"{hub.url}/hub/metrics", headers={"Authorization": f"token {ADMIN_TOKEN}"}
            )
        ) as resp:
            text = resp.read().decode()
        return text if 'gpupool_usage_allocated_gpu_hours{dimension="user",key="kim"}' in text else None

    metrics = until(scrape, "usage gauges on /hub/metrics", timeout=30)
    assert 'gpupool_budget_used_ratio{target="group:students",user="kim"}' in metrics
    # every query of the chart's Grafana dashboards names a series (and labels) exported here,
    # by the culler or by the node agent (their own ports: their real exposition code)
    assert dashboards.unknown([metrics, dashboards.culler_text(), dashboards.node_agent_text()]) == []

    # a restart: the same figures, from the event log and the allocations alone
    hub.api("DELETE", f"/services/gpupool/api/jobs/{job['id']}", token=stu)
    before = rows(hub.api("GET", f"{U}?period=24h&by=user"))
    hub.stop()
    hub.start()
    after = rows(hub.api("GET", f"{U}?period=24h&by=user"))
    for user in ("kim", "stu"):
        assert after[user]["allocated_gpu_hours"] >= before[user]["allocated_gpu_hours"] - 0.001
        assert after[user]["allocated_gpu_hours"] <= before[user]["allocated_gpu_hours"] + 0.05


def test_a_queued_job_says_when_it_should_start_and_why(make_hub) -> None:
    hub: Hub = make_hub(USAGE_CONFIG).start()
    token = hub.user_token("eta")
    first = hub.api(
        "POST",
        "/services/gpupool/api/jobs",
        {"project": "default", "gpus": 4, "command": ["sleep", "300"], "max_runtime_s": 900},
        token=token,
    )
    hub.wait_job(first["id"], {"running"}, token)
    started = hub.api("GET", f"/services/gpupool/api/jobs/{first['id']}", token=token)["started"]
    second = hub.api(
        "POST",
        "/services/gpupool/api/jobs",
        {"project": "default", "gpus": 1, "command": "true"},
        token=token,
    )
    assert second["state"] == "queued"
    eta = second["eta"]
    assert eta["start"] == pytest.approx(started + 900, abs=2)  # when the first one's max runtime ends
    assert f"job {first['id']} of default is expected to end" in eta["after"]
    assert eta["text"].startswith("starts around ") and "(in 1" in eta["text"]
    assert "no finished job of this project yet" in eta["basis"]
    assert hub.api("GET", f"/services/gpupool/api/jobs/{first['id']}", token=token)["eta"] is None  # running
    for job in (second, first):
        hub.api("DELETE", f"/services/gpupool/api/jobs/{job['id']}", token=token)
    try:
        hub.api("GET", f"{U}?period=1h", token="not-a-token")
    except urllib.error.HTTPError as err:
        assert err.code == 403
