"""One policy over a workload, through the same pure scheduler the hub runs
(gpupool.pool.training.schedule): a scheduling pass every CYCLE, and one when a preempted
job's grace period ends (the embedded service ticks every few seconds, so freed GPUs are
handed over at once)."""

from __future__ import annotations

import heapq
import itertools
import math
import random
from collections.abc import Callable
from dataclasses import dataclass, field

from benchmarks.quota.workload import SimJob, Workload
from gpupool.pool import MILLI_PER_GPU, ClusterState, Request, get_policy
from gpupool.pool.pools import NodePool
from gpupool.pool.training import Job, Project, schedule

CYCLE = 300.0
GRACE = 60.0
CHECKPOINT = 1800.0


@dataclass
class Result:
    jobs: list[SimJob] = field(default_factory=list)
    alloc_samples: list[float] = field(default_factory=list)
    contended_alloc: list[float] = field(default_factory=list)
    lost_gpu_s: float = 0.0
    preemptions: int = 0
    reclaim_waits: list[float] = field(default_factory=list)  # in-quota jobs that needed a reclaim
    in_quota_waits: list[float] = field(default_factory=list)  # every in-quota job
    late: list[str] = field(default_factory=list)  # in-quota jobs that waited > CYCLE + GRACE
    moves: int = 0
    pool_alloc: dict[str, list[float]] = field(default_factory=dict)  # per node pool, per cycle


def simulate(
    w: Workload,
    static: bool,
    reserve_after_s: float | None = None,
    declared: bool = False,
    pools: dict[str, NodePool] | None = None,
    job_pools: Callable[[SimJob], tuple[str, ...]] | None = None,
    observe: Callable[..., None] | None = None,
) -> Result:
    """(static) each project may use its guarantee and never more; (not static) guaranteed
    quotas: idle GPUs lent by weight, over-quota jobs preempted when a guarantee is claimed.
    `reserve_after_s`: reserve a node for an in-quota gang job after that wait (None: never).
    `declared`: each run declares a max runtime (what it still needs, rounded up to the hour),
    which lets the scheduler know when a reserved node frees and backfill short runs; else
    runs declare none (as most users). `pools` and `job_pools`: node pools, and which a job
    may use in order of preference (benchmarks/quota/pools.py). `observe(now, state, projects,
    pending, running, stopping, as_job, jobs)` is called after each pass (benchmarks.eta)."""
    projects = w.projects
    if static:
        projects = {
            n: Project(n, p.guarantee_milli, p.weight, limit_milli=p.guarantee_milli)
            for n, p in projects.items()
        }
    state = ClusterState(w.inventory)
    masks = {n: p.mask(w.inventory, state.gpu_free.shape[1]) for n, p in (pools or {}).items()}
    policy = get_policy("best-fit")
    rng = random.Random(0)
    res = Result()
    seq = itertools.count()
    arrivals: list[tuple[float, int, SimJob]] = []

    def arrive(job: SimJob | None) -> None:
        if job is not None:
            res.jobs.append(job)
            heapq.heappush(arrivals, (job.submitted, next(seq), job))

    for j in w.jobs:
        arrive(SimJob(**{**j.__dict__}))
    for s in w.streams:
        s = type(s)(s.id, s.project, s.periods, s.seed, s.runtimes)  # fresh: same experiments
        arrive(s.next_job(0.0))
    pending: dict[str, SimJob] = {}
    running: dict[str, SimJob] = {}
    stopping: list[tuple[float, str, SimJob]] = []  # (stop time, id, job) during grace
    pins: dict[str, object] = {}
    cap = w.inventory.capacity_milli
    now = next_cycle = last_pass = 0.0
    while now < w.horizon:
        while arrivals and arrivals[0][0] <= now:
            j = heapq.heappop(arrivals)[2]
            pending[j.id] = j
        for j in list(running.values()):  # runs that ended
            if j.done + (now - j.started) >= j.work:
                j.finished = j.started + (j.work - j.done)
                state.release(j.placement)
                del running[j.id]
                if j.stream is not None:
                    nxt = j.stream.next_job(j.finished)
                    if nxt is not None and nxt.submitted <= now:
                        pending[nxt.id] = nxt
                        res.jobs.append(nxt)
                    else:
                        arrive(nxt)
        while stopping and stopping[0][0] <= now:  # preempted runs whose grace ended
            _, _, j = heapq.heappop(stopping)
            state.release(j.placement)
            j.placement = pins.pop(j.id, None)  # a consolidation planned its next spot
            pending[j.id] = j
        for jid, spot in pins.items():
            if jid in pending:
                pending[jid].placement = spot
        _mark_in_quota(projects, pending, running, now, last_pass)
        last_pass = now

        def as_job(j: SimJob) -> Job:
            bound = math.ceil((j.work - j.done) / 3600) * 3600.0 if declared else 0.0
            return Job(
                j.id,
                j.project,
                Request.for_gpus(j.gpus * 1000),
                j.submitted,
                started=j.started,
                placement=j.placement,
                max_runtime_s=bound,
                pools=job_pools(j) if job_pools else (),
            )

        plan = schedule(
            state,
            projects,
            [as_job(j) for j in pending.values()],
            [as_job(j) for j in running.values()],
            now,
            policy,
            rng,
            stopping=[as_job(j) for _, _, j in stopping],
            reserve_after_s=reserve_after_s,
            pools=pools,
        )
        for r in plan.reserve:  # pinned to its reserved spot, as the hub does
            pins[r.job] = r.placement
            pending[r.job].placement = r.placement
        stops = [(p.job, p.for_job) for p in plan.preempt]
        for m in plan.move:
            stops.append((m.job, m.for_job))
            pins[m.job], pins[m.for_job] = m.to, m.target
            res.moves += 1
        for job_id, for_job in stops:
            j = running.pop(job_id)
            ran = now - j.started
            saved = (ran // CHECKPOINT) * CHECKPOINT
            res.lost_gpu_s += (ran - saved) * j.gpus
            j.done += saved
            res.preemptions += 1
            j.started = None
            heapq.heappush(stopping, (now + GRACE, j.id, j))
            if for_job in pending:
                pending[for_job].needs_reclaim = True
        for a in plan.admit:
            pins.pop(a.job, None)
            j = pending.pop(a.job)
            state.apply(a.placement)
            j.placement, j.started = a.placement, now
            if j.first_start is None:
                j.first_start = now
            if j.in_quota_since is not None:
                res.in_quota_waits.append(now - j.in_quota_since)
                if now - j.in_quota_since > CYCLE + GRACE:
                    res.late.append(j.id)
                if j.needs_reclaim:
                    res.reclaim_waits.append(now - j.in_quota_since)
            j.needs_reclaim, j.in_quota_since = False, None
            running[j.id] = j
        if observe is not None:
            observe(now, state, projects, pending, running, [j for _, _, j in stopping], as_job, res.jobs)
        if now >= next_cycle:  # time averages over the regular cycles
            used = state.used_milli() / cap
            res.alloc_samples.append(used)
            for name, mask in masks.items():
                res.pool_alloc.setdefault(name, []).append(
                    1 - state.gpu_free[mask].sum() / (MILLI_PER_GPU * mask.sum())
                )
            if sum(j.gpus for j in pending.values()) * 1000 + state.used_milli() > cap:
                res.contended_alloc.append(used)
            next_cycle += CYCLE
        now = min([next_cycle] + [t for t, _, _ in stopping])
    return res


def _mark_in_quota(
    projects: dict[str, Project],
    pending: dict[str, SimJob],
    running: dict[str, SimJob],
    now: float,
    last_pass: float,
) -> None:
    """Which pending jobs fit in their project's guarantee (oldest first): from then on the
    project is owed their GPUs and the clock for getting its guarantee back runs, counted
    from the earliest moment it could have (its arrival, or the previous pass)."""
    usage: dict[str, int] = {}
    for j in running.values():
        usage[j.project] = usage.get(j.project, 0) + j.gpus * 1000
    for j in sorted(pending.values(), key=lambda j: (j.submitted, j.id)):
        used = usage.get(j.project, 0) + j.gpus * 1000
        if used <= projects[j.project].guarantee_milli:
            usage[j.project] = used
            if j.in_quota_since is None:
                j.in_quota_since = max(j.submitted, last_pass)
        else:
            j.in_quota_since = None
