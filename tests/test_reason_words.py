"""One table words every reason a session ends (gpupool.vocab.reason_words); the culler's
message, the status bar and the home page take their words from it."""

from __future__ import annotations

from gpupool.idle_culler.policy import Limits, Workspace, decide
from gpupool.vocab.culling import CullAction, CullReason
from gpupool.vocab.reason_words import PRESENT, STOPPED, UPCOMING

# not reasons a session is stopped for: no reason, a kernel restart, the park timer's key
NOT_STOPS = {CullReason.NONE, CullReason.RESTART_KERNEL, CullReason.PARK}


def test_every_reason_a_session_is_stopped_for_is_worded_for_the_home_page() -> None:
    missing = [r for r in CullReason if r not in NOT_STOPS and r not in STOPPED]
    assert missing == [], f"the home page would say no reason for {missing}"


def test_every_limit_the_status_bar_announces_is_worded_ahead() -> None:
    # the status bar's "stops at 18:00 at the end of the workday" for each limit with a time
    for reason in (CullReason.IDLE_GPU, CullReason.IDLE_JUPYTER, CullReason.MAX_AGE, CullReason.WORKDAY_END):
        assert UPCOMING[reason] and UPCOMING[reason] != STOPPED[reason]


def test_the_culler_says_the_tables_words_when_it_stops_and_warns() -> None:
    now = 1_800_000_000.0
    idle = Workspace("ann", "", started=now - 7200, last_activity=now - 3600, gpu_idle_s=3600.0)
    d = decide(idle, now, Limits())
    assert (d.action, d.reason) == (CullAction.CULL, CullReason.IDLE_GPU)
    assert d.message == f"stopped because {PRESENT[CullReason.IDLE_GPU]}"
    old = Workspace("bob", "", started=now - 3 * 3600, last_activity=now, gpu_idle_s=0.0)
    d = decide(old, now, Limits(max_age_s=3 * 3600 + 300, warn_before_s=900))
    assert (d.action, d.reason) == (CullAction.WARN, CullReason.MAX_AGE)
    assert PRESENT[CullReason.MAX_AGE] in d.message and "will stop in 5 min" in d.message
