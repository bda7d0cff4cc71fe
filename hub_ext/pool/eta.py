"""When will a queued train job start: a forward simulation of the pure scheduler. No I/O, no clock.

From the pool as it is, the scheduler (`gpupool.pool.training.schedule`, the very actions the
hub runs) is replayed forward in time: each running job ends when it is expected to, each
preempted job leaves when its grace period ends and queues again; at every such moment (and
when a borrower becomes reclaimable or a gang job becomes due for a reservation) one cycle is
planned, and what it admits starts then. A queued job's estimate is when it was admitted in
that replay; None when it was not admitted within the horizon.

Expected run times (`Runtimes`) come from history per project: a running job that has run for
`e` seconds is expected to run the median of the past runs of its project that lasted longer
than `e` (the heavy tail of training jobs: one that has run long tends to run longer), capped by
its declared max runtime. Jobs not yet submitted are expected as the recent past repeated
(`expected_arrivals`: each submission of the last window comes again one window later, and so
on for a few windows): a project in a burst keeps submitting, and what it submits within its
guarantee goes before a job that waits on borrowed GPUs. Nothing is known of build
workspaces' ends; ends earlier than expected make a job start sooner.
"""

from __future__ import annotations

import bisect
import heapq
import random
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from gpupool.pool.jobs import Department, Job, Project
from gpupool.pool.placement import Policy
from gpupool.pool.pools import NodePool
from gpupool.pool.request import Request
from gpupool.pool.state import ClusterState
from gpupool.pool.training import schedule

DEFAULT_RUNTIME_S = 3600.0  # a project without history: an hour
ARRIVAL_WINDOW_S = 3600.0  # the recent past that is expected to repeat
ARRIVAL_REPEATS = 4  # windows ahead it is expected to repeat for (a burst does not last forever)
MAX_ARRIVALS = 400  # expected jobs at most, whatever the recent rate (bounds a forecast's CPU)


def expected_arrivals(
    recent: Iterable[Job],
    now: float,
    window_s: float = ARRIVAL_WINDOW_S,
    repeats: int = ARRIVAL_REPEATS,
    limit: int = MAX_ARRIVALS,
) -> list[Job]:
    """Jobs expected to be submitted after `now`: each job of `recent` submitted within the
    last `window_s` comes again (same project and size, not yet started) `window_s` later,
    `2 * window_s` later, ... `repeats` times; the earliest first, at most `limit`. Older
    submissions say nothing of the present rate (bursts start and stop) and are ignored."""
    if window_s <= 0 or repeats <= 0 or limit <= 0:
        return []
    last = sorted(
        (j for j in recent if now - window_s < j.submitted <= now), key=lambda j: (j.submitted, j.id)
    )
    out = [
        Job(
            f"expected-{k}-{j.id}",
            j.project,
            j.request,
            j.submitted + k * window_s,
            priority=j.priority,
            min_runtime_s=j.min_runtime_s,
            max_runtime_s=j.max_runtime_s,
            pools=j.pools,
            min_gpus=j.min_gpus,
            max_gpus=j.max_gpus,
        )
        for k in range(1, repeats + 1)
        for j in last
    ]
    out.sort(key=lambda j: (j.submitted, j.id))
    return out[:limit]


@dataclass(frozen=True)
class Runtimes:
    """Seconds past runs lasted, per project (each tuple sorted)."""

    by_project: dict[str, tuple[float, ...]] = field(default_factory=dict)
    default_s: float = DEFAULT_RUNTIME_S

    @classmethod
    def of(cls, history: Mapping[str, Iterable[float]], default_s: float = DEFAULT_RUNTIME_S) -> Runtimes:
        return cls({p: tuple(sorted(v)) for p, v in history.items() if v}, default_s)

    def _history(self, project: str) -> tuple[float, ...]:
        own = self.by_project.get(project)
        if own:
            return own
        merged = sorted(r for v in self.by_project.values() for r in v)
        return tuple(merged)

    def remaining(self, job: Job, elapsed: float) -> float:
        """Expected seconds left of a run that has lasted `elapsed`: the median of the past
        runs that lasted longer, less `elapsed` (none longer: as long again, the least
        surprising guess for a run already past every one seen)."""
        hist = self._history(job.project)
        if not hist:  # counted down from the default, not an hour from every moment it is asked
            left = self.default_s - elapsed if elapsed < self.default_s else max(elapsed, 1.0)
        else:
            longer = hist[bisect.bisect_right(hist, elapsed) :]
            left = longer[len(longer) // 2] - elapsed if longer else max(elapsed, 1.0)
        if job.max_runtime_s > 0:
            left = min(left, job.max_runtime_s - elapsed)
        return max(1.0, left)

    def guessed(self, job: Job, elapsed: float) -> bool:
        """Whether a run's end is a guess: no past run lasted longer than this one has (the
        default hour passed, without history), and it declared no max runtime."""
        if job.max_runtime_s > 0:
            return False
        hist = self._history(job.project)
        return (not hist[bisect.bisect_right(hist, elapsed) :]) if hist else elapsed >= self.default_s


@dataclass(frozen=True)
class Estimate:
    start: float | None  # epoch seconds; None: not within the horizon
    after: str = ""  # what lets it start in the replay, in plain words
    # "job ab12 of vision": a run before it whose end nobody can tell (none of its project's past
    # runs lasted this long), so the time is a guess and is not to be shown as one
    unknown: str = ""


def forecast(
    state: ClusterState,
    projects: dict[str, Project],
    pending: Sequence[Job],
    running: Sequence[Job],
    now: float,
    policy: Policy,
    runtimes: Runtimes,
    stopping: Sequence[Job] = (),
    requeued: Iterable[str] = (),
    departments: dict[str, Department] | None = None,
    pools: dict[str, NodePool] | None = None,
    reserve_after_s: float | None = None,
    grace_s: float = 60.0,
    horizon_s: float = 7 * 86400,
    max_cycles: int = 400,
    seed: int = 0,
    done: dict[str, float] | None = None,
    arrivals: Sequence[Job] = (),
) -> dict[str, Estimate]:
    """Estimated start of every job in `pending`. `state` holds every allocation (it is not
    changed); `stopping` are preempted jobs in their grace period (they leave at `now + grace_s`
    at the latest), those in `requeued` queue again then; `done` is the run time a job saved
    in checkpoints before its current run (where known). The other arguments are the
    scheduler's own (`gpupool.pool.training.schedule`). `arrivals`: jobs expected to be
    submitted later (`expected_arrivals`), queued in the replay when their submit time comes;
    they get no estimate."""
    done = done or {}
    coming = sorted(arrivals, key=lambda j: (j.submitted, j.id))
    coming.reverse()  # popped from the end: the earliest first
    work = state.copy()
    rng = random.Random(seed)
    wanted = {j.id for j in pending}
    pend = {j.id: j for j in pending}
    run = {j.id: j for j in running}
    back = set(requeued)
    ends: list[tuple[float, str]] = []  # (expected end, job id)
    j: Job | None  # one name for a job taken out of the tables below (pop: None when absent)
    guessed: set[str] = set()  # running jobs whose end is a guess (gpupool.pool.eta.Runtimes.guessed)
    blind = ""  # the first such end the replay went past
    for j in running:
        started = now if j.started is None else j.started
        elapsed = done.get(j.id, 0.0) + max(0.0, now - started)
        heapq.heappush(ends, (now + runtimes.remaining(j, elapsed), j.id))
        if runtimes.guessed(j, elapsed):
            guessed.add(j.id)
    leaving: list[tuple[float, str, Job]] = [
        (now + grace_s, j.id, j) for j in stopping if j.placement is not None
    ]
    heapq.heapify(leaving)
    out: dict[str, Estimate] = {}
    pinned: dict[str, Any] = {}  # planned spots (reservations, consolidation) of jobs not yet started
    cause = "now"
    t = now
    for _ in range(max_cycles):
        plan = schedule(
            work,
            projects,
            list(pend.values()),
            list(run.values()),
            t,
            policy,
            rng,
            stopping=[j for _, _, j in leaving],
            departments=departments,
            reserve_after_s=reserve_after_s,
            pools=pools,
        )
        pins = {}
        for r in plan.reserve:  # pinned to its reserved spot, as the hub does
            pins[r.job] = r.placement
        stops = [p.job for p in plan.preempt] + [z.job for z in plan.resize]
        for m in plan.move:
            stops.append(m.job)
            pins[m.job], pins[m.for_job] = m.to, m.target
        for z in plan.resize:
            pins[z.job] = z.to
        pinned.update(pins)
        for job_id, spot in pins.items():
            if job_id in pend:
                pend[job_id] = replace(pend[job_id], placement=spot)
        for job_id in stops:
            j = run.pop(job_id, None)
            if j is not None:
                heapq.heappush(leaving, (t + grace_s, j.id, j))
                back.add(j.id)
        for a in plan.admit:
            j = pend.pop(a.job, None)
            if j is None:
                continue
            pinned.pop(a.job, None)
            work.apply(a.placement)
            size = Request(len(a.placement.gpus)) if j.elastic else j.request
            j = replace(j, started=t, placement=a.placement, request=size)
            run[j.id] = j
            heapq.heappush(ends, (t + runtimes.remaining(j, done.get(j.id, 0.0)), j.id))
            if j.id in wanted and j.id not in out:
                out[j.id] = Estimate(t, cause, blind)
        if wanted <= set(out) or not (pend.keys() & wanted):
            break
        t_next, why = _next_wake(t, ends, leaving, run, pend, projects, reserve_after_s)
        if coming and t_next is None:  # else expected jobs join at the next wake: a wake of
            # their own each would spend the cycles (max_cycles) long before the horizon
            t_next, why = (
                max(t + 1.0, coming[-1].submitted),
                f"more jobs of {coming[-1].project} are expected",
            )
        if t_next is None or t_next > now + horizon_s:
            break
        t = t_next
        cause = why
        while ends and ends[0][0] <= t:
            _, job_id = heapq.heappop(ends)
            j = run.pop(job_id, None)
            if j is not None and j.placement is not None:
                work.release(j.placement)
                if job_id in guessed and not blind:
                    blind = f"job {job_id} of {j.project}"
        while coming and coming[-1].submitted <= t:
            j = coming.pop()
            pend[j.id] = j
        while leaving and leaving[0][0] <= t:
            _, job_id, j = heapq.heappop(leaving)
            work.release(j.placed)
            if job_id in back:
                pend[job_id] = replace(j, started=None, placement=pinned.pop(job_id, None))
    for job_id in wanted:
        out.setdefault(job_id, Estimate(None, ""))
    return out


def _next_wake(
    t: float,
    ends: list[tuple[float, str]],
    leaving: list[tuple[float, str, Job]],
    run: dict[str, Job],
    pend: dict[str, Job],
    projects: dict[str, Project],
    reserve_after_s: float | None,
) -> tuple[float | None, str]:
    """The next moment the plan may change, and why: a run ends, a grace period ends, a
    borrower passes its min runtime (reclaimable then), a gang job becomes due for a reservation."""
    while ends and ends[0][1] not in run:  # runs preempted in the replay: no end of theirs
        heapq.heappop(ends)
    options: list[tuple[float, str]] = []
    if ends:
        end, job_id = ends[0]
        options.append((end, f"job {job_id} of {run[job_id].project} is expected to end"))
    if leaving:
        options.append((leaving[0][0], "a preempted job's grace period ends"))
    for j in run.values():
        if j.min_runtime_s > 0 and j.started is not None and j.started + j.min_runtime_s > t:
            options.append((j.started + j.min_runtime_s, f"job {j.id} passes its min runtime"))
    if reserve_after_s is not None:
        for j in pend.values():
            due = j.submitted + reserve_after_s
            if j.request.num_gpu >= 2 and due > t:
                options.append((due, f"job {j.id} gets a node reserved"))
    options = [o for o in options if o[0] > t]
    if not options:
        return None, ""
    return min(options, key=lambda o: o[0])
