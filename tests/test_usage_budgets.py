"""GPU-hour budgets (gpupool.usage.budgets): the pure rules, and a property test of the whole
loop — spawns and train jobs admitted by the budget, the culler's own policy deciding each
pass — that no budget is overrun by more than one culler interval of idle GPU and that no
running cell is ever interrupted by a budget."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from traitlets import TraitError

from gpupool.idle_culler.policy import IdleTracker, Limits, Workspace, decide
from gpupool.usage import budgets as bud
from gpupool.usage.accounting import MILLI_S_PER_GPU_HOUR, Held
from gpupool.usage.config import Usage

H = 3600
WEEK = 7 * 86400


def held(milli: int, start: int, end: int | None, owner: str = "ann", groups=()) -> Held:
    return Held("build", owner, f"{owner}-{start}", milli, start, end, tuple(groups))


def test_config_reads_budgets_per_member_shared_and_per_user_and_refuses_bad_ones() -> None:
    rules = Usage(
        budgets={
            "students": {"gpu_hours": 40, "min_share": 0.1},
            "cs101": {"gpu_hours": 200, "window_days": 7, "shared": True},
            "user:ada": {"gpu_hours": 100, "window_days": 30, "warn_at": 0.5},
        }
    ).budget_rules()
    by = {r.target: r for r in rules}
    assert by["group:students"] == bud.Rule("group:students", 40 * MILLI_S_PER_GPU_HOUR, WEEK, 80, 100, False)
    assert (
        by["group:cs101"].shared and by["user:ada"].warn_pct == 50 and by["user:ada"].window_s == 30 * 86400
    )
    assert by["group:students"].describe() == "40 GPU-h per week (each member of group students)"
    for bad, why in (
        ({"x": {"gpu_hours": -1}}, "gpu_hours"),
        ({"x": {"hours": 1}}, "gpu_hours and some"),
        ({"x": {"gpu_hours": 1, "window_days": 400}}, "window_days"),
        ({"user:a": {"gpu_hours": 1, "shared": True}}, "cannot be shared"),
        ({"x": {"gpu_hours": 1, "min_share": "lots"}}, "min_share"),
    ):
        with pytest.raises(TraitError, match=why):
            Usage(budgets=bad).budget_rules()


def test_a_users_own_rule_wins_else_the_most_generous_group_plus_shared_ones() -> None:
    rules = [
        bud.Rule("group:students", 40 * H * 1000, WEEK),
        bud.Rule("group:ta", 80 * H * 1000, WEEK),
        bud.Rule("group:cs101", 200 * H * 1000, WEEK, shared=True),
        bud.Rule("user:ann", 10 * H * 1000, WEEK),
    ]
    assert [r.target for r in bud.rules_for(rules, "bob", ["students", "ta", "cs101"])] == [
        "group:ta",
        "group:cs101",
    ]
    assert [r.target for r in bud.rules_for(rules, "ann", ["students"])] == ["user:ann"]
    assert bud.rules_for(rules, "eve", ["other"]) == []


def test_state_is_fraction_weighted_over_the_rolling_window_with_warnings_and_top_ups() -> None:
    rule = bud.Rule("group:students", 4 * MILLI_S_PER_GPU_HOUR, WEEK, warn_pct=80, min_share_milli=100)
    now = 10 * WEEK
    # 0.5 GPU for 7 h in the window, and 0.5 GPU for 10 h that ended before the window began
    rows = [held(500, now - 7 * H, now), held(500, now - WEEK - 20 * H, now - WEEK - 10 * H)]
    s = bud.state(rule, rows, [], now)
    assert (s.status, s.used_milli_s) == ("near", 500 * 7 * H)  # 3.5 of 4 GPU-h
    over = bud.state(rule, [*rows, held(250, now - 4 * H, None)], [], now)
    assert over.status == "over" and over.used_pct == 112
    # it frees when the window has slid past enough of the old use: 0.5 GPU-h must leave the window
    assert over.frees_at == now + WEEK - 6 * H + 1
    assert bud.admits([over], 100, "build") is None  # the minimum share still starts
    assert bud.admits([over], 250, "build") is over and bud.admits([over], 0, "train") is over
    top = bud.Grant("user:ann", "topup", 2 * MILLI_S_PER_GPU_HOUR, now + H)
    assert bud.state(rule, [*rows, held(250, now - 4 * H, None)], [top], now, "ann").status == "ok"
    expired = replace(top, until=now)
    assert bud.state(rule, [*rows, held(250, now - 4 * H, None)], [expired], now, "ann").status == "over"
    exempt = bud.Grant("group:students", "exempt", 0, now + H)
    assert bud.state(rule, [*rows, held(250, now - 4 * H, None)], [exempt], now, "bob").status == "exempt"
    assert "used up" in over.message(lambda t: "Tue 14:00") and "until Tue 14:00" in over.message(
        lambda t: "Tue 14:00"
    )


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(st.integers(1, 40_000), st.integers(1, 40_000), st.sampled_from([100, 250, 1000])),
        max_size=12,
    ),
    st.integers(1, 20),
)
def test_frees_at_is_the_first_moment_the_window_has_room(spans, limit_h) -> None:
    now, window = 50_000, 20_000
    rows = [held(m, s, min(now, s + d)) for s, d, m in spans]
    limit = limit_h * 100 * 3600 // 10

    def spent(t: int) -> int:
        return sum(h.milli * h.seconds_in(t - window, now, now) for h in rows)

    t = bud.frees_at(rows, window, limit, now)
    assert t >= now and spent(t) < limit
    assert t == now or spent(t - 1) >= limit


# --- the property: budgets never kill, and the overrun is one culler interval of idle GPU ---------

INTERVAL = 30  # seconds between culler passes
MIN_SHARE = 100


def step_plan():
    """A user's behaviour, one item per culler interval: what they try to do then."""
    op = st.one_of(
        st.tuples(st.just("spawn"), st.sampled_from([100, 250, 500, 1000])),
        st.tuples(st.just("cell"), st.integers(1, 20)),  # a cell that runs this many intervals
        st.tuples(st.just("job"), st.integers(1, 30)),  # a train job of 1 GPU for this many intervals
        st.tuples(st.just("stop"), st.just(0)),
        st.tuples(st.just("wait"), st.integers(1, 40)),
    )
    return st.lists(op, min_size=1, max_size=60)


@settings(max_examples=300, deadline=None)
@given(step_plan(), st.integers(1, 40), st.booleans())
def test_no_budget_overrun_beyond_one_culler_interval_and_no_running_cell_interrupted(
    plan, budget_min, parking
):
    rule = bud.Rule("user:ann", budget_min * 60 * 1000, 6 * H, min_share_milli=MIN_SHARE)
    limits = Limits(
        window_s=INTERVAL,
        idle_limit_s=10**9,
        jupyter_idle_s=10**9,
        gpu_idle_hard_s=0,
        max_age_s=10**9,
        busy_grace_s=0,
        park_after_s=0,
    )
    intervals: list[Held] = []  # everything ann held, closed and open
    ws: dict | None = None  # the workspace: {"milli", "start", "parked", "cell_left", "tracker", "over_idle"}
    job: dict | None = None  # a queued or running train job: {"left", "start"}
    now = 0
    todo = [item for op in plan for item in ([op] + [("tick", 0)] * (op[1] if op[0] == "wait" else 0))]
    crossed_at = None
    for op, arg in todo + [("tick", 0)] * 60:
        states = [bud.state(rule, intervals, [], now)]
        over = states[0].status == "over"
        crossed_at = now if over and crossed_at is None else (crossed_at if over else None)
        # --- what the user tries, admitted by the budget as the hub does
        if op == "spawn" and ws is None:
            refused = bud.admits(states, arg, "build")
            assert refused is None or arg > MIN_SHARE  # the minimum share always starts
            if refused is None:
                ws = {
                    "milli": arg,
                    "start": now,
                    "parked": False,
                    "cell_left": 0,
                    "tracker": IdleTracker(limits.window_s, limits.util_threshold_pct),
                }
                intervals.append(Held("build", "ann", "ws", arg, now, None))
                assert not over or arg <= MIN_SHARE  # nothing above the minimum share starts over budget
        elif op == "cell" and ws is not None:
            ws["cell_left"] = arg
            if ws["parked"]:  # the kernel asks for its GPU back: never refused (the cell is running)
                ws["parked"] = False
                intervals.append(Held("build", "ann", "ws", ws["milli"], now, None))
                ws["tracker"] = IdleTracker(limits.window_s, limits.util_threshold_pct)
        elif op == "stop" and ws is not None:
            if not ws["parked"]:
                _close(intervals, "ws", now)
            ws = None
        elif op == "job" and job is None and bud.admits(states, 1000, "train") is None:
            job = {"left": arg, "start": None}
        # --- the training service: a queued job of a user over budget waits
        if job is not None and job["start"] is None and not over:
            job["start"] = now
            intervals.append(Held("train", "ann", "job", 1000, now, None))
        # --- the culler's pass, with the hub's "budget" field on the target
        if ws is not None and not ws["parked"]:
            busy = ws["cell_left"] > 0
            ws["tracker"].add(now, 90.0 if busy else 0.0)
            w = Workspace(
                "ann",
                "",
                ws["start"],
                last_activity=now,
                gpu_idle_s=ws["tracker"].idle_s,
                budget=("park" if parking else "stop") if over else "",
            )
            d = decide(w, now, limits)
            if busy:  # a running cell is never parked or stopped, budget or not
                assert d.action not in ("park", "cull"), (d, now)
            if d.reason == "budget":
                assert over and not busy
                # the GPU was idle for a window at most one pass ago: the idle GPU time taken over
                # budget is at most one culler interval (plus the window that shows it idle)
                idle_since = now - ws["tracker"].idle_s
                assert now - max(idle_since, crossed_at or now) <= limits.window_s + 2 * INTERVAL
                _close(intervals, "ws", now)
                if d.action == "park":
                    ws["parked"] = True
                else:
                    ws = None
        # --- time passes
        now += INTERVAL
        if ws is not None and ws["cell_left"] > 0:
            ws["cell_left"] -= 1
        if job is not None and job["start"] is not None:
            job["left"] -= 1
            if job["left"] <= 0:
                _close(intervals, "job", now)
                job = None
        # the bound, every interval: over budget, an idle GPU above the minimum share is not
        # held longer than one window and two passes after the budget ran out or the cell ended
        if (
            ws is not None
            and not ws["parked"]
            and ws["cell_left"] == 0
            and crossed_at is not None
            and ws["milli"] > MIN_SHARE
        ):
            idle_for = min(now - crossed_at, ws["tracker"].idle_s + INTERVAL)
            assert idle_for <= limits.window_s + 3 * INTERVAL


def _close(intervals: list[Held], name: str, now: int) -> None:
    for i, h in enumerate(intervals):
        if h.name == name and h.end is None:
            intervals[i] = replace(h, end=now)
