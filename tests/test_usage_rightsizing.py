"""Right-sizing advice (gpupool.usage.rightsizing): N sessions each at or under half their
share's memory suggest the smallest allowed size that holds the peak with headroom."""

from __future__ import annotations

from gpupool.usage.accounting import Held, Session, over_requesters
from gpupool.usage.rightsizing import advise, freed

SIZES = (100, 250, 500, 1000)


def session(
    owner: str, start: int, peak: int, milli: int = 1000, share: int = 16000, end: int | None = 0
) -> Session:
    return Session(owner, "", milli, start, start + 3600 if end == 0 else end, peak, share, milli * 3600)


def test_three_small_sessions_suggest_the_smallest_size_that_holds_the_peak() -> None:
    sess = [session("ann", t, peak) for t, peak in ((0, 3000), (4000, 3200), (8000, 2500))]
    a = advise(sess, "ann", SIZES, 3)
    assert (a.current_milli, a.suggested_milli, a.peak_memory_mib) == (
        1000,
        250,
        3200,
    )  # 4,000 MiB >= 3,200 x 1.25
    assert "0.25 GPU would do" in a.message()
    held = [
        Held("build", "ann", "", 1000, 0, 7200),
        Held("build", "ann", "", 250, 0, 3600),
        Held("build", "bob", "", 1000, 0, 3600),
    ]
    assert freed(a, held, 0, 3600, 7200) == 750 * 3600  # only ann's sessions of the advised size


def test_no_advice_without_n_sessions_a_big_peak_an_open_session_or_a_smaller_size() -> None:
    small = [session("ann", t, 2000) for t in (0, 4000, 8000)]
    assert advise(small[:2], "ann", SIZES, 3) is None  # two sessions only
    assert (
        advise([*small[:2], session("ann", 8000, 9000)], "ann", SIZES, 3) is None
    )  # one used more than half
    assert (
        advise([*small[:2], session("ann", 8000, 2000, end=None)], "ann", SIZES, 3) is None
    )  # still running
    assert advise([*small[:2], session("ann", 8000, 2000, milli=500, share=8000)], "ann", SIZES, 3) is None
    assert (
        advise([session("ann", t, 7000) for t in (0, 1, 2)], "ann", (500, 1000), 3) is None
    )  # 0.5 is too small
    assert advise(small, "ann", SIZES, 0) is None


def test_over_requesters_rank_the_lowest_peak_against_share_first() -> None:
    sess = [session("ann", 0, 1600), session("bob", 0, 12000), session("cy", 0, 800, milli=500, share=8000)]
    held = [Held("build", u, "", m, 0, 3600) for u, m in (("ann", 1000), ("bob", 1000), ("cy", 500))]
    rows = over_requesters(sess, held, 0, 3600, 3600)
    assert [(r["user"], r["peak_pct"]) for r in rows] == [("ann", 10), ("cy", 10), ("bob", 75)]
    assert rows[0]["allocated_gpu_hours"] == 1.0
