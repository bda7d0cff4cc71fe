"""The culling benchmark counts what a user loses to a cull however long they stay away (#41):
an overnight cull of a user who comes back next morning is a lost kernel state, though it is
not a false cull (that counts returns within 30 minutes only)."""

from benchmarks.culling.__main__ import replay, verdict_line
from benchmarks.culling.sessions import Session
from gpupool.idle_culler.policy import Limits

H = 3600.0
STOCK = Limits(idle_limit_s=H, jupyter_idle_s=0, max_age_s=0)  # the stock culler: Jupyter idle 1 h


def evening_then_morning() -> Session:
    # opens 16:00, one 10-minute cell, the next cell 17 h later (09:00 next day)
    return Session(gpus=1, lifetime_s=20 * H, cells=((0.0, 600.0), (17 * H, 17 * H + 600)), start_tod=16 * H)


def test_an_overnight_cull_is_a_lost_state_not_a_false_cull() -> None:
    _, _, culls, false, killed, returned = replay(evening_then_morning(), STOCK, gpu_aware=False)
    # culled at 19:00 and back at 09:00; the morning session is culled again, never returned to
    assert (culls, false, killed, returned) == (2, 0, 0, 1)


def test_a_cull_never_returned_from_loses_nothing() -> None:
    s = Session(gpus=1, lifetime_s=20 * H, cells=((0.0, 600.0),), start_tod=16 * H)
    assert replay(s, STOCK, gpu_aware=False)[2:] == (1, 0, 0, 0)


def test_the_verdict_line_carries_lost_states_beside_the_stock_culler() -> None:
    ours = {"used_pct": 74.2, "false_cull_sessions_pct": 0.0, "returned": 66, "culls": 229, "killed": 0}
    stock = {"used_pct": 58.1, "false_cull_sessions_pct": 0.0, "returned": 70, "culls": 243, "killed": 64}
    line = verdict_line(ours, stock, 88.1, 0, "rules")
    assert "66 lost kernel states of 229 culls" in line and "70 lost of 243" in line
    assert ": met;" in line
    assert "NOT met" in verdict_line({**ours, "killed": 1}, stock, 88.1, 0, "rules")
