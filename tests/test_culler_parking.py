"""The park action of the culler's policy: between warning and stopping, with overrides, and
what a parked workspace is still held to (its time limits)."""

from __future__ import annotations

import pytest
from traitlets import TraitError

from gpupool.idle_culler.config import IdleCuller
from gpupool.idle_culler.policy import PARKED, CullerPolicy, Limits, Workspace, decide

T0 = 1_780_000_000.0
PARKING = Limits(park_after_s=600, idle_limit_s=1800, jupyter_idle_s=900, max_age_s=12 * 3600)


def ws(gpu_idle_s, last_activity_ago=3600.0, **kw) -> Workspace:
    now = T0 + 4 * 3600
    return Workspace(
        "ann", "", started=T0, last_activity=now - last_activity_ago, gpu_idle_s=gpu_idle_s, **kw
    )


NOW = T0 + 4 * 3600


def test_an_idle_gpu_is_parked_before_it_would_be_warned_or_stopped():
    assert decide(ws(300), NOW, PARKING).action == "keep"
    d = decide(ws(600), NOW, PARKING)
    assert (d.action, d.reason, d.message) == ("park", "idle-gpu", PARKED)
    # even a user still typing in Jupyter gets parked: nothing is lost, the GPU comes back
    assert decide(ws(600, last_activity_ago=10), NOW, PARKING).action == "park"


def test_without_parking_the_same_workspace_is_stopped():
    off = Limits(idle_limit_s=1800, jupyter_idle_s=900)
    assert decide(ws(1800), NOW, off).action == "cull"


def test_a_parked_workspace_is_not_stopped_for_gpu_idleness_but_its_time_limits_hold():
    parked = ws(None, parked=True)
    d = decide(parked, NOW, PARKING)
    assert (d.action, d.message) == ("keep", PARKED)
    late = T0 + 12 * 3600 + 1
    assert decide(parked, late, PARKING).action == "cull"
    assert decide(parked, late, PARKING).reason == "max-age"
    warned = decide(parked, T0 + 12 * 3600 - 600, PARKING)
    assert warned.action == "warn" and warned.reason == "max-age"


def test_parked_stop_s_ends_an_abandoned_parked_session():
    limits = Limits(park_after_s=600, parked_stop_s=8 * 3600, max_age_s=10**9)
    assert decide(ws(None, parked=True, last_activity_ago=7 * 3600), NOW, limits).action == "keep"
    d = decide(ws(None, parked=True, last_activity_ago=8 * 3600 + 1), NOW, limits)
    assert (d.action, d.reason) == ("cull", "parked-idle")


def test_when_parking_failed_the_gpu_idle_rules_stop_it():
    assert decide(ws(1800, park_failed=True), NOW, PARKING).action == "cull"


def test_missing_gpu_data_never_parks():
    assert decide(ws(None), NOW, PARKING).action != "park"


def test_a_due_time_limit_stops_rather_than_parks():
    assert decide(ws(3600), T0 + 12 * 3600 + 1, PARKING).action == "cull"


def test_per_group_and_profile_park_thresholds():
    cfg = IdleCuller(
        park_after_s=0,
        group_overrides={"lab": {"park_after_s": 300}},
        profile_overrides={"big-model": {"park_after_s": 120}},
    )
    policy: CullerPolicy = cfg.policy()
    assert cfg.parks()
    assert decide(ws(600), NOW, policy.limits_for([])).action != "park"
    assert decide(ws(300), NOW, policy.limits_for(["lab"])).action == "park"
    assert decide(ws(120), NOW, policy.limits_for(["lab"], "big-model")).action == "park"


@pytest.mark.parametrize("bad", [-1, "600", True, 10**12])
def test_hostile_park_thresholds_are_refused(bad):
    with pytest.raises(TraitError, match="park_after_s"):
        IdleCuller(group_overrides={"x": {"park_after_s": bad}})


def test_the_status_widget_shows_the_parked_line():
    from gpupool.widgets.status import parking_rows

    assert parking_rows({"state": "running"}) == []
    assert parking_rows({"state": "parked", "message": PARKED}) == [("GPU parked", PARKED)]
    waiting = {"state": "waiting", "message": "waiting for a A100 GPU (1 GPU) for 12 s"}
    assert parking_rows(waiting)[0][1].startswith("waiting for a A100 GPU")
