"""The culler's decisions, with time as an argument: nothing here sleeps."""

from __future__ import annotations

import datetime as dt
from dataclasses import replace
from zoneinfo import ZoneInfo

import pytest
from gpupool.idle_culler.config import IdleCuller
from gpupool.idle_culler.policy import CullerPolicy, IdleTracker, Limits, Workspace, decide, workday_cutoff
from hypothesis import given
from hypothesis import strategies as st

T0 = 1_790_000_000.0
LIMITS = Limits(idle_limit_s=3600, jupyter_idle_s=600, gpu_idle_hard_s=4 * 3600, max_age_s=12 * 3600,
                warn_before_s=900, extension_s=1800)


def ws(**kw) -> Workspace:
    base = dict(owner="ann", name="", started=T0, last_activity=T0, gpu_idle_s=0.0)
    return Workspace(**{**base, **kw})


def test_idle_is_counted_in_whole_windows_and_any_use_resets() -> None:
    t = IdleTracker(window_s=30, threshold_pct=1)
    for s in range(0, 300, 10):
        t.add(T0 + s, 0)
    assert t.idle_s == 270  # nine closed windows; the current one is not counted yet
    t.add(T0 + 305, 40)
    assert t.idle_s == 0
    t.add(T0 + 335, 0)  # the window with the busy sample closes busy
    assert t.idle_s == 0
    t.add(T0 + 365, 0.5)  # below the threshold counts as idle
    assert t.idle_s == 30


@given(st.lists(st.tuples(st.integers(1, 60), st.floats(0, 100)), max_size=60))
def test_idle_never_exceeds_the_time_since_the_last_use(samples) -> None:
    t = IdleTracker(window_s=30, threshold_pct=5)
    now, last_use = T0, T0
    for gap, util in samples:
        now += gap
        t.add(now, util)
        if util >= 5:
            last_use = now
    assert 0 <= t.idle_s <= now - last_use + 30


def test_gpu_idle_and_jupyter_quiet_workspace_is_warned_then_culled() -> None:
    d = decide(ws(gpu_idle_s=2800), T0 + 2800, LIMITS)
    assert (d.action, d.reason) == ("warn", "idle-gpu")
    assert "will stop in 13 min because its GPU has been idle" in d.message
    assert decide(ws(gpu_idle_s=3600), T0 + 3600, LIMITS).action == "cull"


def test_a_user_still_typing_keeps_an_idle_gpu_only_until_the_hard_limit() -> None:
    typing = T0 + 3.9 * 3600
    assert decide(ws(gpu_idle_s=3.9 * 3600, last_activity=typing), typing, LIMITS).action == "warn"
    d = decide(ws(gpu_idle_s=4 * 3600, last_activity=T0 + 4 * 3600), T0 + 4 * 3600, LIMITS)
    assert (d.action, d.reason) == ("cull", "idle-gpu-long")
    # with GPU data, a short Jupyter silence suffices once the GPU idled long enough
    d = decide(ws(gpu_idle_s=3600, last_activity=T0 + 3600 - 600), T0 + 3600, LIMITS)
    assert d.action == "cull"


def test_gpu_busy_workspace_is_kept_though_jupyter_is_stale() -> None:
    d = decide(ws(gpu_idle_s=0, last_activity=T0), T0 + 5 * 3600, LIMITS)
    assert d.action == "keep"


def test_missing_gpu_data_never_culls_for_gpu_idleness() -> None:
    # no GPU data: Jupyter activity decides; an active user keeps the workspace
    d = decide(ws(gpu_idle_s=None, last_activity=T0 + 3 * 3600), T0 + 3 * 3600 + 60, LIMITS)
    assert d.action == "keep" and d.reason == "idle-jupyter"
    d = decide(ws(gpu_idle_s=None, last_activity=T0), T0 + 3600 + 600, LIMITS)
    assert (d.action, d.reason) == ("cull", "idle-jupyter")  # the longer, Jupyter-only limit


def test_max_age_and_the_one_extension() -> None:
    busy, limits = dict(gpu_idle_s=0), replace(LIMITS, busy_grace_s=0)
    assert decide(ws(**busy), T0 + 12 * 3600, limits).reason == "max-age"
    assert decide(ws(**busy), T0 + 12 * 3600, limits).action == "cull"
    assert decide(ws(extended=True, **busy), T0 + 12 * 3600, limits).action == "keep"
    assert decide(ws(extended=True, **busy), T0 + 12 * 3600 + 1000, limits).action == "warn"
    assert decide(ws(extended=True, **busy), T0 + 12 * 3600 + 1800, limits).action == "cull"


def test_a_time_limit_waits_for_running_gpu_work_but_not_forever() -> None:
    limits = replace(LIMITS, busy_grace_s=2 * 3600)
    at_limit = T0 + 12 * 3600
    d = decide(ws(gpu_idle_s=0, last_activity=T0), at_limit + 60, limits)
    assert (d.action, d.reason) == ("warn", "max-age") and "as soon as its GPU work ends" in d.message
    # the cell ends: the next pass stops it
    assert decide(ws(gpu_idle_s=limits.window_s, last_activity=T0), at_limit + 600, limits).action == "cull"
    # still busy after the grace: stopped anyway
    assert decide(ws(gpu_idle_s=0, last_activity=T0), at_limit + 2 * 3600, limits).action == "cull"
    # no GPU data: no grace (it cannot tell work from a hung process)
    assert decide(ws(gpu_idle_s=None, last_activity=at_limit), at_limit + 60, limits).action == "cull"


def test_workday_cutoff_in_the_configured_time_zone() -> None:
    berlin = ZoneInfo("Europe/Berlin")
    start = dt.datetime(2026, 11, 23, 9, 30, tzinfo=berlin).timestamp()
    limits = Limits(workday_end="19:00", timezone="Europe/Berlin", max_age_s=24 * 3600)
    assert workday_cutoff(start, limits) == dt.datetime(2026, 11, 23, 19, 0, tzinfo=berlin).timestamp()
    late = dt.datetime(2026, 11, 23, 20, 0, tzinfo=berlin).timestamp()  # started after hours
    assert workday_cutoff(late, limits) == dt.datetime(2026, 11, 24, 19, 0, tzinfo=berlin).timestamp()
    d = decide(ws(started=start, gpu_idle_s=None, last_activity=start + 9.4 * 3600), start + 9.5 * 3600, limits)
    assert (d.action, d.reason) == ("cull", "workday-end")


def test_exempt_users_are_never_culled() -> None:
    assert decide(ws(exempt=True, gpu_idle_s=10**6), T0 + 10**6, LIMITS).action == "keep"


def test_memory_overrun_warns_then_the_resolver_acts() -> None:
    over = dict(memory_mib=9000, memory_limit_mib=8192, memory_over_since=T0)
    d = decide(ws(**over), T0 + 10, Limits(memory_resolver="stop", memory_grace_s=300))
    assert (d.action, d.reason) == ("warn", "memory") and "more than its share of 8192 MiB" in d.message
    assert decide(ws(**over), T0 + 300, Limits(memory_resolver="stop", memory_grace_s=300)).action \
        == "resolve-memory"
    assert decide(ws(**over), T0 + 10**5, Limits(memory_resolver="warn")).action == "warn"


def test_group_and_profile_overrides() -> None:
    policy = CullerPolicy(default=LIMITS, groups={"research": {"idle_limit_s": 7200}, "ta": {"idle_limit_s": 5400}},
                          profiles={"data-prep": {"idle_limit_s": 3 * 3600}})
    assert policy.limits_for(["research", "ta"]).idle_limit_s == 7200  # the most generous group
    assert policy.limits_for([]).idle_limit_s == 3600
    assert policy.limits_for(["ta"], "data-prep").idle_limit_s == 3 * 3600  # profile wins


def test_config_rejects_unknown_override_keys() -> None:
    with pytest.raises(ValueError, match=r"unknown keys \['idle_limit'\]"):
        IdleCuller(group_overrides={"x": {"idle_limit": 1}}).policy()


def test_with_the_default_limits_a_busy_gpu_is_never_warned_it_has_been_idle() -> None:
    """The defaults warn 15 min before a cull and cull after 15 min of GPU idle: a user computing
    must not read "will stop in 15 min because its GPU has been idle" at every pass."""
    limits = Limits()
    assert limits.warn_before_s >= limits.idle_limit_s  # the case this guards
    now = 10_000.0
    busy = Workspace("ann", "", started=now - 7200, last_activity=now - 3600, gpu_idle_s=0.0)
    assert decide(busy, now, limits).action == "keep"
    idle = replace(busy, gpu_idle_s=120.0)  # idle for a while: now the warning is true
    warned = decide(idle, now, limits)
    assert warned.action == "warn" and warned.reason == "idle-gpu" and "will stop in 13 min" in warned.message
