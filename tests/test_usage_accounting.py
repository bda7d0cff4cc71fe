"""Usage accounting: the pure arithmetic (gpupool.usage.accounting) and its reading of the event
log (gpupool.usage.ledger) through real allocations in a real store, across a hub restart."""

from __future__ import annotations

import datetime as dt
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpupool.alloc.manager import PoolManager, Workload
from gpupool.pool import BuildLimits, Request, virtual_inventory
from gpupool.pool.pools import NodePool
from gpupool.store import Event, Store, TrainJob
from gpupool.usage import accounting as acc
from gpupool.usage.config import Usage
from gpupool.usage.ledger import Ledger
from gpupool.usage.service import UsageService
from tests.support.pools import make_pool

H = 3600
GPU_H = acc.MILLI_S_PER_GPU_HOUR


def held(owner="ann", milli=250, start=0, end=H, kind="build", groups=(), project="", pools=(), name=""):
    return acc.Held(
        kind, owner, name or f"{owner}-{start}", milli, start, end, tuple(groups), project, tuple(pools), "m"
    )


def test_allocated_is_fraction_times_time_clipped_to_the_period() -> None:
    rows = [held("ann", 250, 0, 2 * H), held("bob", 1000, H, None)]  # bob still holds at now = 3 h
    t = acc.totals(rows, H, 4 * H, now=3 * H, by="user")
    assert t["ann"].allocated == 250 * H  # only the second hour is in the period
    assert t["bob"].allocated == 1000 * 2 * H  # open: counted until now, not the period's end
    assert acc.gpu_hours(t["bob"].allocated) == 2.0


def test_dimensions_count_a_session_under_each_of_its_groups() -> None:
    rows = [
        held("ann", 500, 0, H, groups=("students", "cs101")),
        held("cy", 1000, 0, H, kind="train", project="vision", pools=("dgx",)),
    ]
    by_group = acc.totals(rows, 0, H, H, "group", groups_of=lambda o: ("staff",) if o == "cy" else ())
    assert {k: v.allocated for k, v in by_group.items()} == {
        "students": 500 * H,
        "cs101": 500 * H,
        "staff": 1000 * H,
    }
    by_project = acc.totals(rows, 0, H, H, "project")
    assert set(by_project) == {acc.BUILD, "vision"}
    assert set(acc.totals(rows, 0, H, H, "pool")) == {acc.ANY_POOL, "dgx"}
    with pytest.raises(ValueError, match="unknown dimension"):
        acc.totals(rows, 0, H, H, "colour")


def test_used_and_waste_come_from_samples_of_the_session_and_never_exceed_what_was_measured() -> None:
    h = held("ann", 500, 0, 2 * H)
    uses = [
        acc.UseRow(0, "build", "ann", h.name, 0, 500, 500 * H, 100 * H, 3000, 8000),
        acc.UseRow(1, "build", "ann", h.name, 0, 500, 500 * H // 2, 10**12, 1000, 8000),
    ]  # a bogus row
    t = acc.totals([h], 0, 2 * H, 2 * H, "user", uses)["ann"]
    assert t.measured == 500 * H + 500 * H // 2
    assert t.used == 100 * H + 500 * H // 2  # capped at what was measured
    assert t.waste == t.measured - t.used
    assert t.peak_memory_mib == 3000 and t.share_memory_mib == 8000


def test_cost_uses_the_pools_price_then_the_models_then_the_default() -> None:
    prices = acc.Prices(default=1_000_000, by_pool={"dgx": 4_000_000}, by_model={"m": 2_000_000})
    rows = [held("a", 1000, 0, H, pools=("dgx",)), held("b", 500, 0, H)]
    t = acc.totals(rows, 0, H, H, "user", prices=prices)
    assert t["a"].cost == 4_000_000 and t["b"].cost == 1_000_000  # model "m": half a GPU-hour at 2


def test_series_buckets_add_up_to_the_total() -> None:
    rows = [held("ann", 250, 100, 5000), held("bob", 1000, 1800, None)]
    s = acc.series(rows, 0, 7200, 600, now=6000, by="user")
    assert len(s["ann"]) == 12
    assert sum(s["ann"]) == 250 * 4900 and sum(s["bob"]) == 1000 * (6000 - 1800)


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.integers(0, 10_000),
            st.integers(1, 10_000),
            st.sampled_from([100, 250, 1000, 2000]),
            st.booleans(),
        ),
        max_size=20,
    ),
    st.integers(0, 20_000),
    st.integers(1, 20_000),
    st.integers(60, 5000),
)
def test_series_and_totals_agree_for_any_intervals(spans, a, span, step) -> None:
    now = 25_000
    rows = [
        held(f"u{i % 3}", m, s, None if open_ else s + d, name=f"w{i}")
        for i, (s, d, m, open_) in enumerate(spans)
    ]
    b = a + span
    totals = acc.totals(rows, a, b, now, "user")
    series = acc.series(rows, a, b, step, now, "user")
    for user, t in totals.items():
        assert sum(series.get(user, [0])) == t.allocated


def test_waits_per_project_are_nearest_rank_percentiles() -> None:
    jobs = [
        acc.JobEvent("start", f"j{i}", "ann", "vision", 1000 + i, wait_s=w)
        for i, w in enumerate(range(0, 100, 5))
    ]
    jobs.append(acc.JobEvent("start", "late", "ann", "vision", 10**9, wait_s=10**6))  # outside the period
    w = acc.waits(jobs, 0, 10_000)
    assert w == {"vision": {"p50_s": 45, "p95_s": 90, "jobs": 20}}
    assert acc.percentile([], 50) is None


def small_pool(tmp_path, name="usage.sqlite") -> PoolManager:
    limits = BuildLimits(
        quota_milli=4000, sizes_milli=(250, 500, 1000), max_per_workspace_milli=2000, max_workspaces=5
    )
    pool = make_pool(tmp_path, 2, limits=limits, db=name)
    pool.node_pools = {"low": NodePool("low", gpus=frozenset({0}))}
    return pool


def backdate(store: Store, seconds: float) -> None:
    """Move every record `seconds` into the past: time travel without sleeping."""
    with store.session() as s:
        for e in s.query(Event).all():
            e.time -= dt.timedelta(seconds=seconds)
            if isinstance((e.data or {}).get("since"), int | float):
                e.data = {**e.data, "since": e.data["since"] - seconds}
        from gpupool.store import Allocation

        for r in s.query(Allocation).all():
            r.created -= dt.timedelta(seconds=seconds)


def test_the_ledger_reads_allocations_from_the_event_log_and_is_the_same_after_a_restart(
    tmp_path, store_url
) -> None:
    pool = small_pool(tmp_path, store_url)
    pool.reserve_build("ann", ["students"], "", 250)
    pool.reserve_build("bob", ["staff"], "big", 1000)
    backdate(pool.store, 2 * H)  # both reserved two hours ago
    pool.release(Workload("build", "ann", ""), reason="stopped")
    backdate(pool.store, H)  # ann stopped an hour ago; bob still holds
    ledger = Ledger(pool.store, pool.inventory, pool.node_pools)
    import time

    now = int(time.time())
    rows = ledger.held(now - 4 * H, now + 1)
    assert {(h.owner, h.milli, h.end is None) for h in rows} == {("ann", 250, False), ("bob", 1000, True)}
    t = acc.totals(rows, now - 4 * H, now + 1, now, "user")
    assert t["ann"].allocated == pytest.approx(250 * 2 * H, abs=250 * 3)
    assert t["bob"].allocated == pytest.approx(1000 * 3 * H, abs=1000 * 3)
    groups = acc.totals(rows, now - 4 * H, now + 1, now, "group")
    assert set(groups) == {"students", "staff"}
    # a restarted hub: a new store object and manager on the same file, nothing in memory
    again = make_pool(tmp_path, pool.inventory, limits=pool.quotas, db=store_url)
    rows2 = Ledger(again.store, again.inventory, pool.node_pools).held(now - 4 * H, now + 1)
    assert sorted(rows2, key=lambda h: h.owner) == sorted(rows, key=lambda h: h.owner)
    # what reconcile releases after a crash closes the open interval; nothing is counted twice
    again.reconcile(lambda row: False)
    rows3 = Ledger(again.store, again.inventory).held(now - 4 * H, int(time.time()) + 1)
    assert len(rows3) == 2 and all(h.end is not None for h in rows3)


def test_train_runs_count_under_their_project_and_node_pool(tmp_path) -> None:
    pool = small_pool(tmp_path)
    with pool.store.session() as s:
        s.add(
            TrainJob(
                id="j1",
                owner="cy",
                project="vision",
                name="x",
                num_gpu=1,
                gpu_milli=1000,
                command=["true"],
                workdir="/nonexistent",
                submitted=0.0,
            )
        )
    pool.reserve(Workload("train", "cy", "j1"), Request(1))
    rows = Ledger(pool.store, pool.inventory, pool.node_pools).held(0, 2**31)
    (h,) = rows
    assert (h.kind, h.project, h.milli) == ("train", "vision", 1000)
    assert h.pools in ((), ("low",)) and h.model == "virtual"


def test_a_legacy_release_without_its_interval_is_paired_with_its_allocate_event(tmp_path) -> None:
    store = Store(f"sqlite:///{tmp_path / 'old.sqlite'}")
    t0 = dt.datetime(2026, 1, 1, 10, 0)
    with store.session() as s:
        s.add(
            Event(
                kind="allocate",
                owner="ann",
                name="",
                message="build ann/default holds 0.5 GPU",
                time=t0,
                data={"milli": 500},
            )
        )
        s.add(
            Event(
                kind="release",
                owner="ann",
                name="",
                message="build ann/default released 0.5 GPU: stopped",
                time=t0 + dt.timedelta(hours=2),
                data={"milli": 500},
            )
        )
    rows = Ledger(store, virtual_inventory(1)).held(0, 2**31)
    assert [(h.kind, h.end - h.start, h.milli) for h in rows] == [("build", 2 * H, 500)]


def test_samples_of_the_culler_become_used_hours_bounded_by_the_gap(tmp_path) -> None:
    pool = small_pool(tmp_path)
    row = pool.reserve_build("ann", [], "", 500)
    since = row.created.replace(tzinfo=dt.UTC).timestamp()
    ledger = Ledger(pool.store, pool.inventory)
    w = {
        "owner": "ann",
        "name": "",
        "gpu_data": True,
        "gpu_util_pct": 25.0,
        "memory_mib": 1200,
        "memory_limit_mib": 8192,
    }
    t = since + 60
    assert ledger.record_samples([w], t, gap_s=180) == 1  # the first: since the session began (60 s)
    ledger.record_samples([w], t + 30, gap_s=180)
    ledger.record_samples(
        [{**w, "gpu_util_pct": 100.0, "memory_mib": 4000}], t + 30 + 3600, gap_s=180
    )  # a gap
    ledger.record_samples([{**w, "gpu_data": False}], t + 4000, gap_s=180)  # stale: nothing
    uses = ledger.uses(0, 2**31)
    measured = sum(u.measured_milli_s for u in uses)
    used = sum(u.used_milli_s for u in uses)
    assert measured == 500 * (60 + 30 + 180)
    # 25 % of a whole GPU is 250 milli of this 500 milli share; 100 % is capped at the share
    assert used == 250 * 90 + 500 * 180
    assert max(u.peak_memory_mib for u in uses) == 4000


def test_a_report_pages_sorts_by_waste_and_writes_csv_a_spreadsheet_will_not_run(tmp_path) -> None:
    pool = small_pool(tmp_path)
    for user, milli in (("ann", 250), ("=cmd|calc", 1000), ("bob", 500)):
        pool.reserve_build(user, [], "", milli)
    import time

    usage = UsageService(
        pool, Usage(currency="EUR", prices={"default": 2.0}), clock=lambda: time.time() + 1800
    )
    now = usage.now()
    for user in ("ann", "=cmd|calc", "bob"):
        row = pool.allocation(Workload("build", user, ""))
        since = row.created.replace(tzinfo=dt.UTC).timestamp()
        util = {"ann": 90.0, "=cmd|calc": 5.0, "bob": 40.0}[user]
        usage.ledger.record_samples(
            [{"owner": user, "name": "", "gpu_data": True, "gpu_util_pct": util}], since + 120, gap_s=180
        )
    # the window starts two hours back: used hours are kept per clock hour, and an hour that began
    # before the window's start would be left out (the test would depend on the minute it runs)
    report = usage.report(now - 7200, now + 1, "user", sort="waste", limit=2)
    assert report["rows_total"] == 3 and len(report["rows"]) == 2
    assert report["rows"][0]["key"] == "=cmd|calc"  # the most allocated and least used
    assert report["total"]["allocated_gpu_hours"] == pytest.approx(1.75 * 0.5, abs=0.01)
    assert report["total"]["cost"] == pytest.approx(2.0 * 1.75 * 0.5, abs=0.02)
    page2 = usage.report(now - 7200, now + 1, "user", sort="waste", offset=2, limit=2)
    assert [r["key"] for r in page2["rows"]] == ["ann"]
    text = usage.csv(report)
    assert text.splitlines()[0].startswith("user,allocated_gpu_hours")
    assert "\n'=cmd|calc," in text  # quoted so that a spreadsheet shows it instead of running it


def test_retention_deletes_old_records_and_keeps_what_is_still_held(tmp_path, store_url) -> None:
    import time

    pool = small_pool(tmp_path, store_url)
    pool.reserve_build("old", [], "", 250)
    pool.release(Workload("build", "old", ""), reason="stopped")
    pool.reserve_build("still", [], "", 500)
    ledger = Ledger(pool.store, pool.inventory)
    row = pool.allocation(Workload("build", "still", ""))
    ledger.record_samples(
        [{"owner": "still", "name": "", "gpu_data": True, "gpu_util_pct": 50.0}],
        row.created.replace(tzinfo=dt.UTC).timestamp() + 60,
        gap_s=180,
    )
    ledger.add_grant("user:old", "topup", 1000, int(time.time()) - 100 * 86400, "admin")  # ended long ago
    backdate(pool.store, 100 * 86400)  # everything happened 100 days ago
    with pool.store.session() as s:
        from gpupool.store import UsageHour

        for u in s.query(UsageHour).all():
            u.hour -= 100 * 24
    now = time.time()
    assert ledger.prune(now - 90 * 86400) >= 4  # the events, the hour of samples, the ended grant
    assert pool.store.events(limit=100) == [] and ledger.uses(0, 2**31) == [] and ledger.grant_rows(0) == []
    # the share still held is counted from its allocation, whatever the log kept
    (h,) = ledger.held(now - 200 * 86400, now + 1)
    assert (h.owner, h.end) == ("still", None) and now - h.start >= 100 * 86400 - 5


def test_one_budget_reads_the_same_on_the_form_in_the_refusal_and_in_the_labs_toast(tmp_path) -> None:
    """A 0.05 GPU-h daily budget, 0.054 GPU-h used (0.25 GPU for 778 s): before, the form said
    "0.1 of 0.05 GPU-h", the refusal "0.054 of 0.05", the lab's toast "0.1 of 0.1", and the rule
    "per a day"."""

    from gpupool.pool import PoolError
    from gpupool.vocab.kinds import WorkloadKind
    from gpupool.widgets.summary import budget_summary
    from tests.test_labextension_text import run

    pool = small_pool(tmp_path)
    pool.reserve_build("ann", [], "", 250)
    t0 = pool.allocation(Workload("build", "ann", "")).created.replace(tzinfo=dt.UTC).timestamp()
    usage = UsageService(
        pool, Usage(budgets={"user:ann": {"gpu_hours": 0.05, "window_days": 1}}), clock=lambda: t0 + 778
    )
    said = "0.054 of 0.05 GPU-h"
    [note] = usage.form_notes("ann", [])
    assert f"{said} used (108 %) of the budget 0.05 GPU-h per day (user ann)" in note, note
    with pytest.raises(PoolError) as refused:
        usage.check("ann", [], 250, WorkloadKind.BUILD)
    assert f"is used up, {said} (108 %)" in str(refused.value), refused.value
    budget = budget_summary(usage.budget_json("ann", []))
    toast = run(f"t.budgetWarning({{budget: {json.dumps(budget)}}})")
    assert toast["message"].startswith(f"GPU-hour budget used up: {said}."), toast


async def test_the_usage_pages_first_period_fits_a_new_hubs_data(tmp_path) -> None:
    """A hub minutes old showed its use as a sliver at the right edge of a 24 h plot: the page
    now opens on the last hour until something held began before it."""
    import time

    from gpupool.admin.usage_page import usage_view

    pool = small_pool(tmp_path)
    pool.reserve_build("ann", [], "", 250)
    fresh = await usage_view(UsageService(pool, Usage(), clock=lambda: time.time() + 600), {}, 2)
    assert fresh["period"] == "1h" and fresh["error"] == ""
    older = await usage_view(UsageService(pool, Usage(), clock=lambda: time.time() + 7200), {}, 2)
    assert older["period"] == "24h"
    assert (await usage_view(UsageService(pool, Usage()), {"period": "7d"}, 2))[
        "period"
    ] == "7d"  # a pick wins


def test_a_culler_whose_clock_runs_ahead_has_its_samples_counted_now_not_in_a_later_hour(tmp_path) -> None:
    """A report dated an hour ahead (a culler pod's clock skewed, or a pass near the hour's turn)
    is filed under the hub's present hour, so the session's peak reaches the advice at once."""
    pool = small_pool(tmp_path)
    pool.reserve_build("ann", [], "", 1000)
    t = 100 * H + 1800
    usage = UsageService(pool, Usage(), clock=lambda: t)
    w = {"owner": "ann", "name": "", "gpu_data": True, "gpu_util_pct": 4.0, "memory_mib": 1500}
    usage.record_report([w], t + H)
    rows = usage.ledger.uses(t - H, t + 1, "ann")
    assert [(r.hour, r.peak_memory_mib) for r in rows] == [(t // H, 1500)]


def test_an_admins_grant_holds_or_releases_a_queued_job_at_once_not_a_cache_later(tmp_path) -> None:
    """The budget states that decide which queued jobs wait are cached (CACHE_S) for the
    training passes that ask again and again; an admin's exemption, its end and a top-up are
    read at once, at the same instant: the next pass releases (or holds) the job."""
    pool = small_pool(tmp_path)
    t = 100 * H
    usage = UsageService(pool, Usage(budgets={"user:bob": {"gpu_hours": 0}}), clock=lambda: t)
    queued = TrainJob(id="j1", owner="bob", project="nlp", state="queued")
    assert "budget" in usage.held_jobs([queued])["j1"]  # none granted: held
    exempt = usage.add_grant("user:bob", "exempt", 0, t + H, "lead")
    assert usage.held_jobs([queued]) == {}
    assert usage.end_grant(exempt, t, "lead")
    assert list(usage.held_jobs([queued])) == ["j1"]
    usage.add_grant("user:bob", "topup", GPU_H, t + H, "lead")
    assert usage.held_jobs([queued]) == {}
