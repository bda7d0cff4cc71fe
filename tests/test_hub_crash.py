"""kill -9 of the hub loses no allocation and creates no duplicate."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess

import pytest

from tests.hubtools import Hub
from tests.support.wait import until

pytestmark = pytest.mark.hub


def shares_by_owner(hub: Hub) -> dict[str, list[tuple[int, str, int | None]]]:
    out: dict[str, list] = {}
    for s in hub.allocations():
        out.setdefault(s["owner"], []).append((s["milli"], s["state"], s["pid"]))
    return out


def test_kill_9_and_restart_keeps_running_shares_and_drops_half_made_ones(make_hub) -> None:
    hub: Hub = make_hub().start()
    hub.spawn("u1", "0.5")
    hub.spawn("u2", "0.25")
    before = shares_by_owner(hub)
    assert sorted(before) == ["u1", "u2"]

    hub.kill9()
    # the crash happened while u3's spawn had persisted its reservation but had not
    # started a process yet: exactly the row a dying hub leaves behind
    db = sqlite3.connect(hub.state / "gpupool.sqlite")
    with db:
        db.execute(
            "INSERT INTO gpupool_allocations (kind, owner, name, node, gpus, gpu_milli, cpu_milli,"
            " memory_mib, groups, state, created, updated)"
            " VALUES ('build', 'u3', '', 'localhost', '[3]', 1000, 0, 0, '[]', 'reserved',"
            " '2026-01-01 00:00:00', '2026-01-01 00:00:00')"
        )
    db.close()
    # ...and its server process had started: alive, pinned to GPU 3, unknown to the hub
    orphan = subprocess.Popen(
        ["sleep", "600"], env={**os.environ, "GPUPOOL_WORKSPACE": "u3/", "CUDA_VISIBLE_DEVICES": "3"}
    )

    hub.start()
    # the start-up reconcile runs once the hub's own API answers, just after the hub comes up
    until(
        lambda: shares_by_owner(hub) == before,
        "the shares as before the crash",
        timeout=30,
        detail=lambda: shares_by_owner(hub),
    )
    assert shares_by_owner(hub) == before  # same shares, same server processes, and u3's half-made one gone
    per_gpu: dict[int, int] = {}
    for s in hub.allocations():
        per_gpu[s["gpu"]] = per_gpu.get(s["gpu"], 0) + s["milli"]
    assert all(v <= 1000 for v in per_gpu.values())
    assert orphan.wait(timeout=30) == -signal.SIGTERM  # the orphan was stopped, not left on GPU 3

    # the restarted hub still manages those servers: stopping releases, restarting re-allocates once
    hub.stop_server("u1")
    assert "u1" not in shares_by_owner(hub)
    hub.spawn("u1", "1")
    assert [m for m, _, _ in shares_by_owner(hub)["u1"]] == [1000]
    events = hub.api("GET", "/services/gpupool/api/events?kind=release")["events"]
    assert any("u3" in e["message"] and "reconciled" in e["message"] for e in events)
