"""A spawn's reservation off the hub's event loop (PoolManager.reserve_build_async), and the
scan-free reads that made a spawn cheap at 500 workspaces (benchmarks/kube)."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

import pytest

from gpupool.alloc.hooks import PoolHooks
from gpupool.alloc.manager import PoolManager
from gpupool.pool import BuildLimits, BuildQuotaPolicy, QuotaExceeded
from tests.support.pools import make_pool

QUOTAS = BuildQuotaPolicy(default=BuildLimits(500, (250, 500), 500, 2), group_totals_milli={"cs101": 500})


def manager(tmp_path: Path, gpus: int = 4, hooks: PoolHooks | None = None) -> PoolManager:
    return make_pool(tmp_path, gpus, limits=QUOTAS, placement="frag-aware", hooks=hooks)


async def test_the_event_loop_runs_while_a_spawn_reserves(tmp_path: Path) -> None:
    """The reservation waits on something only the event loop can give (a gate opened by a
    task): run on the loop it would block the loop, and the gate would never open."""
    gate = threading.Event()
    blocked: list[str] = []

    class Gated(PoolHooks):
        def admit(self, w, groups, milli) -> None:  # stands for the reads, placement and commit
            if not gate.wait(5):
                blocked.append("the event loop was blocked while the reservation ran")

    pm = manager(tmp_path, hooks=Gated())
    reserving = asyncio.create_task(pm.reserve_build_async("ann", [], "", 250))
    for _ in range(100):  # the loop goes on: other users' requests are served meanwhile
        await asyncio.sleep(0.01)
        if reserving.done():
            break
        gate.set()
    row = await reserving
    assert blocked == []
    assert (row.owner, row.total_milli) == ("ann", 250)
    assert pm.state.used_milli() == 250


async def test_concurrent_spawns_off_the_loop_keep_every_quota(tmp_path: Path) -> None:
    """Forty users, two servers each asked for at once, four GPUs: the manager's lock keeps the
    quota check and the placement of each one together, as on the loop."""
    pm = manager(tmp_path, gpus=4)
    asks = [
        pm.reserve_build_async(f"u{i}", ["cs101"] if i < 4 else [], name, 250)
        for i in range(40)
        for name in ("", "two")
    ]
    results = await asyncio.gather(*asks, return_exceptions=True)
    held = [r for r in results if not isinstance(r, BaseException)]
    refused = [r for r in results if isinstance(r, BaseException)]
    assert all(isinstance(r, QuotaExceeded) or "no GPU has room" in str(r) for r in refused), refused
    assert len(held) == 16  # 4 GPUs of 4 shares each, never more
    cs101 = [r for r in held if r.owner in {"u0", "u1", "u2", "u3"}]
    assert sum(r.total_milli for r in cs101) <= 500  # the group's total, checked under the lock
    rows = pm.store.allocations(kind="build")
    assert sorted((r.owner, r.name) for r in rows) == sorted((r.owner, r.name) for r in held)
    assert pm.state.used_milli() == sum(r.total_milli for r in rows)


def test_group_usage_is_read_only_for_a_group_with_a_total(tmp_path: Path) -> None:
    pm = manager(tmp_path)
    pm.reserve_build("ann", ["cs101", "other"], "", 250)
    assert pm.group_usage(only=["other"]) == {}  # no total to check: nothing read
    assert pm.group_usage(only=["cs101"]) == {"cs101": 250}
    assert pm.group_usage() == {"cs101": 250, "other": 250}  # the admin page's view: every group
    with pytest.raises(QuotaExceeded, match="group 'cs101' may hold"):
        pm.reserve_build("bob", ["cs101"], "", 500)


def test_a_reservation_returns_the_row_it_stored_and_a_retried_start_gets_it_again(tmp_path: Path) -> None:
    """The share a spawn gets back is the stored row, field for field (written and read through
    SQLAlchemy Core since the ORM's unit of work was most of a spawn's reservation CPU), and its
    allocation event is written with it; a retried start of the same server gets that row again."""
    pm = manager(tmp_path)
    got = pm.reserve_build("ann", ["cs101"], "", 250)
    (stored,) = pm.store.allocations(owner="ann")
    columns = [c.key for c in stored.__table__.columns]
    assert {k: getattr(got, k) for k in columns} == {k: getattr(stored, k) for k in columns}
    assert (got.state, got.groups, got.total_milli, got.pid) == ("reserved", ["cs101"], 250, None)
    (event,) = pm.store.events(kind="allocate", owner="ann")
    assert event.data["milli"] == 250 and event.time == got.created
    again = pm.reserve_build("ann", ["cs101"], "", 250)
    assert {k: getattr(again, k) for k in columns} == {k: getattr(stored, k) for k in columns}
    assert len(pm.store.events(kind="allocate", owner="ann")) == 1
