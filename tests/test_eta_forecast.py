"""When will a queued job start (gpupool.pool.eta): the pure scheduler replayed forward over the
running jobs' expected ends."""

from __future__ import annotations

import asyncio

from gpupool.pool import ClusterState, Request, get_policy, virtual_inventory
from gpupool.pool.eta import Runtimes, expected_arrivals, forecast
from gpupool.pool.training import Job, Project
from gpupool.train.estimates import eta_text

POLICY = get_policy("best-fit")


def running(
    state: ClusterState,
    job_id: str,
    gpus: int,
    started: float,
    project: str = "p",
    max_runtime_s: float = 0.0,
) -> Job:
    job = Job(job_id, project, Request(gpus), submitted=started, started=started, max_runtime_s=max_runtime_s)
    placement = POLICY.choose(state, job.request, None)
    state.apply(placement)
    return Job(
        job_id,
        project,
        Request(gpus),
        submitted=started,
        started=started,
        placement=placement,
        max_runtime_s=max_runtime_s,
    )


def test_jobs_start_when_the_runs_ahead_of_them_are_expected_to_end() -> None:
    state = ClusterState(virtual_inventory(2))
    projects = {"p": Project("p", 2000)}
    a = running(state, "a", 1, 0, max_runtime_s=600)
    b = running(state, "b", 1, 0, max_runtime_s=1200)
    c = Job("c", "p", Request(1), submitted=10, max_runtime_s=300)
    d = Job("d", "p", Request(2), submitted=20)
    before = state.gpu_free.copy()
    est = forecast(
        state, projects, [c, d], [a, b], now=100, policy=POLICY, runtimes=Runtimes.of({"p": [5000]})
    )
    assert est["c"].start == 600 and "job a of p is expected to end" in est["c"].after  # a's max runtime
    assert est["d"].start == 1200  # c ends at 900 (its max runtime), b at 1200
    assert (state.gpu_free == before).all()  # the pool itself is not changed


def test_a_job_that_cannot_start_within_the_horizon_has_no_estimate() -> None:
    state = ClusterState(virtual_inventory(1))
    big = Job("big", "p", Request(2), submitted=0)  # no node has 2 GPUs
    est = forecast(state, {"p": Project("p", 1000)}, [big], [], now=0, policy=POLICY, runtimes=Runtimes())
    assert est["big"].start is None


def test_a_guarantee_comes_back_by_reclaim_after_the_grace_period() -> None:
    state = ClusterState(virtual_inventory(1))
    projects = {"mine": Project("mine", 1000), "other": Project("other", 0)}
    borrower = running(state, "x", 1, 0, project="other")  # over its (zero) guarantee: reclaimable
    mine = Job("m", "mine", Request(1), submitted=5)
    est = forecast(
        state,
        projects,
        [mine],
        [borrower],
        now=50,
        policy=POLICY,
        runtimes=Runtimes.of({"other": [10**6]}),
        grace_s=60,
    )
    assert est["m"].start == 110  # preempted now, its GPU free when its grace ends
    assert "grace period" in est["m"].after


def test_expected_run_times_come_from_the_longer_runs_of_the_project() -> None:
    r = Runtimes.of({"p": [60, 120, 600, 3600, 7200]})
    job = Job("j", "p", Request(1), submitted=0)
    assert r.remaining(job, 0) == 600  # the median run
    assert r.remaining(job, 1000) == 7200 - 1000  # the median of the runs longer than 1000 s
    assert r.remaining(job, 10_000) == 10_000  # past every run seen: as long again
    capped = Job("k", "p", Request(1), submitted=0, max_runtime_s=1500)
    assert r.remaining(capped, 1000) == 500  # never past its declared max runtime
    assert Runtimes.of({"q": [100]}).remaining(job, 0) == 100  # no history of its own: every project's
    assert Runtimes().remaining(job, 0) == 3600


def test_the_estimate_in_words() -> None:
    import time

    now = time.time()
    text = eta_text(now + 35 * 60, 35 * 60, "job ab12 of vision is expected to end")
    assert (
        text.startswith("starts around ")
        and "(in 35 min), once job ab12 of vision is expected to end" in text
    )
    assert "(now)" in eta_text(now, 10, "now")


def test_a_job_behind_a_run_longer_than_any_past_one_says_it_cannot_tell() -> None:
    """A run has gone 50 min; every past run of its project lasted 10. Before, the job behind it
    read "now" or a time that slipped every minute; it now reads when it really starts: after
    that run ends, a time nobody can tell."""
    state = ClusterState(virtual_inventory(1))
    long = running(state, "long", 1, 0)
    queued = Job("next", "p", Request(1), submitted=100)
    est = forecast(
        state, {"p": Project("p", 1000)}, [queued], [long], now=3000, policy=POLICY,
        runtimes=Runtimes.of({"p": [600, 600, 600]}),
    )  # fmt: skip
    assert est["next"].unknown == "job long of p"
    assert eta_text(est["next"].start, est["next"].start - 3000, est["next"].after, est["next"].unknown) == (
        "after job long of p ends (no past run of this project lasted this long)"
    )
    assert "(now)" not in eta_text(3000, 10, "job long of p is expected to end")  # never "now" behind a run


def test_an_estimate_that_moved_more_than_its_stated_error_says_so(tmp_path) -> None:
    """The first estimate says 'in 60 min' (give or take 15); a higher-priority job submitted
    since goes first, so the job now starts an hour later: its estimate says it moved, and from
    what, instead of silently changing."""
    import sys

    from gpupool.train.estimates import Estimates
    from tests.support.jobs import job_request
    from tests.support.pools import make_training

    svc = make_training(tmp_path, 1, projects={"lab": {"guarantee": 1}})
    sleeper = [sys.executable, "-c", "import time; time.sleep(60)"]
    try:
        svc.submit(job_request(owner="ann", project="lab", name="a", command=sleeper), now=0)
        svc.tick(now=0)
        queued = svc.submit(job_request(owner="ann", project="lab", name="b", command=sleeper), now=1)
        est = Estimates(svc, ttl_s=0)
        # no history: the run ahead ends in an hour
        first = asyncio.run(est.for_job(svc.job(queued.id), now=10))
        assert first["in_s"] == 3590 and first["error_s"] == 3590 / 4
        assert "(in 59 min), once job" in first["text"] and "than first" not in first["text"]
        svc.submit(job_request(owner="bob", project="lab", name="c", command=sleeper, priority=5), now=20)
        moved = asyncio.run(est.for_job(svc.job(queued.id), now=30))
        assert moved["start"] - first["start"] >= 3600  # c's hour first
        assert f"{(moved['start'] - first['start']) / 60:.0f} min later than first estimated" in moved["text"]
        assert "give or take 15 min" in moved["text"], moved
    finally:
        for row in svc.jobs():
            if row.pid:
                svc.runner.preempt(row.pid, 0)


def test_the_last_hours_submissions_are_expected_again_each_hour() -> None:
    old = Job("old", "p", Request(1), submitted=0)  # before the window: says nothing of now
    a = Job("a", "p", Request(2), submitted=5000, max_runtime_s=900)
    b = Job("b", "q", Request(1), submitted=6000)
    out = expected_arrivals([b, old, a], now=7000, window_s=3600, repeats=2)
    assert [(j.project, j.submitted, j.request.num_gpu) for j in out] == [
        ("p", 8600, 2),
        ("q", 9600, 1),
        ("p", 12200, 2),
        ("q", 13200, 1),
    ]
    assert out[0].max_runtime_s == 900 and out[0].started is None and out[0].placement is None
    assert len({j.id for j in out} | {"a", "b"}) == 6  # never the id of a real job
    assert len(expected_arrivals([a, b], now=7000, window_s=3600, repeats=50, limit=3)) == 3  # bounded
    assert expected_arrivals([a, b], now=7000, repeats=0) == []


def test_an_in_quota_job_expected_later_goes_before_a_borrower_waiting_now() -> None:
    # one GPU, busy until 600; "mine" owns it and submitted a job every 1000 s; "other" (no
    # guarantee) waits for it now. Mine's next job arrives before the GPU frees and goes first.
    state = ClusterState(virtual_inventory(1))
    projects = {"mine": Project("mine", 1000), "other": Project("other", 0)}
    busy = running(state, "x", 1, 0, project="mine", max_runtime_s=600)
    waiting = Job("w", "other", Request(1), submitted=50)
    recent = [Job("r", "mine", Request(1), submitted=-500)]
    kw = dict(now=100, policy=POLICY, runtimes=Runtimes.of({"mine": [1000], "other": [1000]}))
    alone = forecast(state, projects, [waiting], [busy], **kw)
    assert alone["w"].start == 600  # nothing else known: it starts when x ends
    coming = expected_arrivals(recent, now=100, window_s=1000, repeats=1)
    assert [j.submitted for j in coming] == [500]
    est = forecast(state, projects, [waiting], [busy], **kw, arrivals=coming)
    assert est["w"].start == 1600  # after mine's expected job (600 to 1600)
    assert "w" in est and not any(k.startswith("expected") for k in est)  # no estimate of its own


def test_the_hub_answers_other_requests_while_a_start_estimate_is_computed(tmp_path) -> None:
    """The forecast takes up to seconds of CPU with jobs expected: it runs in a thread, so the
    hub's other requests (another coroutine on its loop) are answered meanwhile. Job lists
    asked for during it wait for that one forecast; none starts a second. A job submitted during
    it gets the next one, made after it was seen."""
    import sys
    import threading

    from gpupool.pool.eta import forecast
    from gpupool.train.estimates import Estimates
    from tests.support.jobs import job_request
    from tests.support.pools import make_training

    svc = make_training(tmp_path, 1, projects={"lab": {"guarantee": 1}})
    never_run = [sys.executable, "-c", "pass"]  # no tick: they stay queued
    a, b = (
        svc.submit(job_request(owner="ann", project="lab", name=n, command=never_run), now=k)
        for k, n in enumerate("ab")
    )
    release, events, forecasts = threading.Event(), [], []

    def held_forecast(*args, **kwargs):
        forecasts.append(args[1])
        if not release.is_set():  # the first one: on the loop, the loop sees this once it ended
            loop.call_soon_threadsafe(begun.set)
        release.wait(timeout=2)  # the test lets it go; run on the loop, it would time out first
        events.append("forecast ended")
        return forecast(*args, **kwargs)

    loop: asyncio.AbstractEventLoop | None = None
    begun: asyncio.Event | None = None
    est = Estimates(svc, ttl_s=5, clock=lambda: 100.0, compute=held_forecast)

    async def another_request() -> dict | None:
        await begun.wait()
        events.append("another request answered")
        c = svc.submit(job_request(owner="bob", project="lab", name="c", command=never_run), now=2)
        asked_c = asyncio.ensure_future(est.for_job(svc.job(c.id)))
        await asyncio.sleep(0)  # c's request comes while the first forecast is computed
        release.set()
        return await asked_c

    async def main() -> list:
        nonlocal loop, begun
        loop, begun = asyncio.get_running_loop(), asyncio.Event()
        asked = [asyncio.ensure_future(est.for_job(svc.job(j.id))) for j in (a, b, a)]
        other = asyncio.ensure_future(another_request())
        return [*await asyncio.gather(*asked), await other]

    *etas, eta_c = asyncio.run(main())
    assert events == ["another request answered", "forecast ended", "forecast ended"]
    assert [e["in_s"] for e in etas] == [0.0, 3600.0, 0.0], etas  # the same answer as ever
    assert eta_c["in_s"] == 7200.0, eta_c  # c was not in the first one: the second, after it
    assert len(forecasts) == 2  # four callers, two forecasts, one after the other
    asyncio.run(est.for_job(svc.job(b.id)))
    assert len(forecasts) == 2  # still fresh: the cached one


def test_the_forecasts_placement_policy_is_a_twin_the_hubs_own_never_shares() -> None:
    """The forecast chooses on its thread with a twin of the hub's policy: the same choices
    from what the hub's has learned, while the hub's own goes on learning and keeps its caches
    (frag-aware's are for the state it last chose on)."""
    import random

    from gpupool.pool.placement import detached

    for name in ("frag-aware", "fgd"):
        own = get_policy(name)
        for gpus in (1, 1, 2, 4):
            own.learn(Request(gpus))
        hub_view, replay_view = ClusterState(virtual_inventory(4)), ClusterState(virtual_inventory(4))
        own.choose(hub_view, Request(1), random.Random(0))
        twin = detached(own)
        assert twin is not own and twin.target.seen == own.target.seen == 4
        assert twin.choose(replay_view, Request(2), random.Random(0)) == own.choose(
            replay_view.copy(), Request(2), random.Random(0)
        )
        own.learn(Request(8))
        assert twin.target.seen == 4  # learned after the copy: the hub's alone
    frag = get_policy("frag-aware")
    view = ClusterState(virtual_inventory(2))
    frag.choose(view, Request(1), random.Random(0))
    detached(frag).choose(ClusterState(virtual_inventory(2)), Request(1), random.Random(0))
    assert frag._state is view  # the hub's caches were not dropped for the replay's state
    assert detached(POLICY) is POLICY  # stateless: nothing to copy
