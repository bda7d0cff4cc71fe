"""The culler's decisions, with time as an argument: nothing here sleeps."""

from __future__ import annotations

import datetime as dt
from dataclasses import replace
from zoneinfo import ZoneInfo

import pytest
from hypothesis import given
from hypothesis import strategies as st
from traitlets import TraitError
from traitlets.config import Config

from gpupool.idle_culler.config import IdleCuller
from gpupool.idle_culler.policy import CullerPolicy, IdleTracker, Limits, Workspace, decide, workday_cutoff
from gpupool.vocab.culling import CullReason

T0 = 1_790_000_000.0
LIMITS = Limits(
    idle_limit_s=3600,
    jupyter_idle_s=600,
    gpu_idle_hard_s=4 * 3600,
    max_age_s=12 * 3600,
    warn_before_s=900,
    extension_s=1800,
)


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
    d = decide(
        ws(started=start, gpu_idle_s=None, last_activity=start + 9.4 * 3600), start + 9.5 * 3600, limits
    )
    assert (d.action, d.reason) == ("cull", "workday-end")


def test_exempt_users_are_never_culled() -> None:
    assert decide(ws(exempt=True, gpu_idle_s=10**6), T0 + 10**6, LIMITS).action == "keep"


def test_memory_overrun_warns_then_the_resolver_acts() -> None:
    over = dict(memory_mib=9000, memory_limit_mib=8192, memory_over_since=T0)
    d = decide(ws(**over), T0 + 10, Limits(memory_resolver="stop", memory_grace_s=300))
    assert (d.action, d.reason) == ("warn", "memory") and "more than its share of 8192 MiB" in d.message
    assert (
        decide(ws(**over), T0 + 300, Limits(memory_resolver="stop", memory_grace_s=300)).action
        == "resolve-memory"
    )
    assert decide(ws(**over), T0 + 10**5, Limits(memory_resolver="warn")).action == "warn"


def test_group_and_profile_overrides() -> None:
    policy = CullerPolicy(
        default=LIMITS,
        groups={"research": {"idle_limit_s": 7200}, "ta": {"idle_limit_s": 5400}},
        profiles={"data-prep": {"idle_limit_s": 3 * 3600}},
    )
    assert policy.limits_for(["research", "ta"]).idle_limit_s == 7200  # the most generous group
    assert policy.limits_for([]).idle_limit_s == 3600
    assert policy.limits_for(["ta"], "data-prep").idle_limit_s == 3 * 3600  # profile wins


@pytest.mark.parametrize(
    "option, value, message",
    [
        ("workday_end", "25:99", "IdleCuller.workday_end: '25:99' is not a time of day"),
        ("workday_end", "7pm", "IdleCuller.workday_end: '7pm' is not a time of day"),
        ("timezone", "Mars/Olympus", "IdleCuller.timezone: 'Mars/Olympus' is not a time zone"),
        ("timezone", "../../etc/passwd", "is not a time zone"),
        ("idle_limit_s", -1, "IdleCuller.idle_limit_s"),
        (
            "group_overrides",
            {"x": {"idle_limit_s": "soon"}},
            "IdleCuller.group_overrides['x']: idle_limit_s must be seconds from 0 to 1e9, got 'soon'",
        ),
        (
            "group_overrides",
            {"x": {"idle_limit": 1}},
            r"IdleCuller.group_overrides['x']: unknown keys ['idle_limit']",
        ),
        (
            "group_overrides",
            {"x": 3600},
            "IdleCuller.group_overrides['x'] must be a dict of limits, got 3600",
        ),
        ("group_overrides", {"x": {"max_age_s": float("inf")}}, "max_age_s must be seconds"),
        (
            "group_overrides",
            {"x": {"workday_end": "24:00"}},
            "IdleCuller.group_overrides['x']: workday_end '24:00'",
        ),
        (
            "profile_overrides",
            {"big": {"timezone": "Mars/Olympus"}},
            "IdleCuller.profile_overrides['big']: timezone 'Mars/Olympus' is not a time zone",
        ),
        (
            "profile_overrides",
            {"big": {"util_threshold_pct": 101}},
            "util_threshold_pct must be a percentage",
        ),
    ],
)
def test_config_load_rejects_bad_limits_with_the_option_and_value(option, value, message) -> None:
    """A typo in a culler setting stops the hub while it reads its config, not at 19:00 when the
    culler first computes a workday end (or never, for a group nobody of is logged in)."""
    c = Config()
    c.IdleCuller[option] = value
    with pytest.raises(TraitError) as err:
        IdleCuller(config=c)
    assert message in str(err.value)


def test_config_accepts_good_limits() -> None:
    cfg = IdleCuller(
        workday_end="09:30",
        timezone="Europe/Berlin",
        group_overrides={
            "lab": {
                "idle_limit_s": 7200,
                "workday_end": "",
                "timezone": "Asia/Tokyo",
                "memory_resolver": "stop",
                "util_threshold_pct": 5,
            }
        },
    )
    assert cfg.policy().limits_for(["lab"]).idle_limit_s == 7200


def test_among_several_groups_never_beats_any_number() -> None:
    """The most generous group wins, and 0 ("never") is more generous than any time: a user in a
    group that never takes an idle GPU back keeps it, whatever their other groups say."""
    policy = CullerPolicy(
        default=LIMITS,
        groups={
            "research": {"gpu_idle_hard_s": 0},
            "students": {"gpu_idle_hard_s": 3600, "busy_grace_s": 0},
            "lab": {"park_after_s": 0, "parked_stop_s": 0},
            "class": {"park_after_s": 300, "parked_stop_s": 7200},
            "ta": {
                "busy_grace_s": 1800,
                "memory_resolver": "warn",
                "util_threshold_pct": 2,
                "workday_end": "",
            },
            "night": {"memory_resolver": "stop", "util_threshold_pct": 10, "workday_end": "19:00"},
        },
    )
    both = policy.limits_for(["students", "research"])
    assert both.gpu_idle_hard_s == 0
    # a user typing all day with a GPU idle for 5 hours is not stopped (students alone would be)
    busy_typing = ws(gpu_idle_s=5 * 3600.0, last_activity=T0 + 5 * 3600)
    assert decide(busy_typing, T0 + 5 * 3600, both).action != "cull"
    assert decide(busy_typing, T0 + 5 * 3600, policy.limits_for(["students"])).action == "cull"
    parking = policy.limits_for(["class", "lab"])
    assert (parking.park_after_s, parking.parked_stop_s) == (0, 0)
    assert decide(ws(gpu_idle_s=600.0, last_activity=T0), T0 + 600, parking).action != "park"
    # where 0 means "no grace", it is the least generous; the gentlest resolver, lowest idle
    # threshold and no workday end win
    other = policy.limits_for(["students", "ta", "night"])
    assert (other.busy_grace_s, other.memory_resolver, other.util_threshold_pct, other.workday_end) == (
        1800,
        "warn",
        2,
        "",
    )
    assert policy.limits_for(["night", "students"]).workday_end == "19:00"


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


def test_a_cull_for_idleness_says_how_long_it_was_idle_by_the_rule_that_ended_it() -> None:
    from gpupool.idle_culler.policy import idle_for

    ws = Workspace("ann", "", started=0.0, last_activity=600.0, gpu_idle_s=3000.0)
    assert idle_for(ws, 3600.0, CullReason.IDLE_GPU) == 3000.0  # GPU idle 50 min, Jupyter quiet 50 min
    assert idle_for(replace(ws, last_activity=1800.0), 3600.0, CullReason.IDLE_GPU) == 1800.0  # both
    assert idle_for(replace(ws, last_activity=3500.0), 3600.0, CullReason.IDLE_GPU_LONG) == 3000.0
    assert idle_for(replace(ws, gpu_idle_s=None), 3600.0, CullReason.IDLE_JUPYTER) == 3000.0
    assert idle_for(replace(ws, last_activity=None), 3600.0, CullReason.PARKED_IDLE) == 3600.0
    assert idle_for(ws, 3600.0, CullReason.MAX_AGE) is None  # not idleness
