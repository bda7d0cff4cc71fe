"""Train scheduling with guaranteed quotas: pure, `now` is an argument.

Each call to `schedule` looks at the pool and returns explicit actions, like KAI-Scheduler
and Kueue: `admit` (start a job on a placement) and `preempt` (stop an over-quota job so that
its GPUs go back to a project that needs its guarantee). The caller carries them out.

Rules (docs/training.md says the same in prose):
1. A project's *guarantee* is always reclaimable for it: a pending job that keeps its project
   within its guarantee is admitted on free capacity, or on capacity reclaimed from other
   projects' over-quota jobs. It never waits for another project's in-quota work.
2. Idle capacity is lent beyond the guarantee, up to the project's limit; among projects
   waiting to borrow, the one with the least borrowed per unit of over-quota weight goes first.
3. Reclaim preempts over-quota jobs only — lowest priority first, then the youngest, never one
   that has run less than its min runtime — never an in-quota job, never a build workspace.
4. A preempted job keeps its place in the queue (its original submit time) and resumes.
5. Multi-GPU jobs are gang-admitted: all GPUs on one node, or not at all.
6. Consolidation: when a pending in-quota job is still blocked (fragmentation, or borrowers and
   in-quota shares mixed on every GPU), the jobs on the GPUs it needs on one node are taken
   off: other projects' over-quota jobs preempted, the rest (past their min runtime) moved —
   only if every moved job fits again elsewhere; the moved jobs and the blocked job are
   pinned to the planned spots. At most CONSOLIDATIONS_PER_CYCLE.
7. No churn: the free part of the spot a reclaim is for is held for its job in that cycle,
   and a project does not borrow while one of its in-quota jobs waits for GPUs (the borrowed
   job would count first next cycle and push the waiting one over its guarantee).
"""

from __future__ import annotations

import random
from collections.abc import Iterable
from dataclasses import dataclass, field

from .placement import Policy
from .request import Placement, Request
from .state import ClusterState
from .units import MILLI_PER_GPU

CONSOLIDATIONS_PER_CYCLE = 3


@dataclass(frozen=True)
class Project:
    name: str
    guarantee_milli: int
    weight: float = 1.0  # share of idle capacity lent beyond the guarantee
    limit_milli: int = -1  # -1: no limit
    priority: int = 0
    department: str = ""

    def cap(self) -> float:
        return float("inf") if self.limit_milli < 0 else self.limit_milli


@dataclass(frozen=True)
class Department:
    """A level above projects (KAI's parent queue): its projects' guarantees add up to at most
    its guarantee, and together they never use more than its limit."""

    name: str
    guarantee_milli: int
    limit_milli: int = -1  # -1: no limit

    def cap(self) -> float:
        return float("inf") if self.limit_milli < 0 else self.limit_milli


@dataclass(frozen=True)
class Job:
    id: str
    project: str
    request: Request
    submitted: float
    priority: int = 0
    min_runtime_s: float = 0.0
    started: float | None = None  # when the current run started (running jobs)
    placement: Placement | None = None  # running jobs; for a pending job, its planned spot

    @property
    def milli(self) -> int:
        return self.request.total_milli


@dataclass(frozen=True)
class Admit:
    job: str
    placement: Placement


@dataclass(frozen=True)
class Preempt:
    job: str
    for_job: str
    reason: str


@dataclass(frozen=True)
class Move:
    """Consolidation: stop `job` (it resumes from its checkpoint) so that `for_job` fits on
    `node`; `to` is where the moved job fits again, checked before anything moves."""

    job: str
    to: Placement
    for_job: str
    target: Placement  # where for_job goes once the moved jobs have stopped


@dataclass
class Plan:
    admit: list[Admit] = field(default_factory=list)
    preempt: list[Preempt] = field(default_factory=list)
    move: list[Move] = field(default_factory=list)


def in_quota_split(projects: dict[str, Project], running: Iterable[Job]) -> tuple[dict[str, int], set[str]]:
    """Usage per project, and which running jobs are over quota: within each project the
    oldest jobs fill the guarantee first, so the youngest are the ones borrowed."""
    usage: dict[str, int] = {}
    over: set[str] = set()
    for job in sorted(running, key=lambda j: (j.started or 0, j.id)):
        used = usage.get(job.project, 0) + job.milli
        usage[job.project] = used
        if used > projects[job.project].guarantee_milli:
            over.add(job.id)
    return usage, over


def schedule(state: ClusterState, projects: dict[str, Project], pending: list[Job], running: list[Job],
             now: float, policy: Policy, rng: random.Random | None = None,
             stopping: list[Job] | None = None, departments: dict[str, Department] | None = None) -> Plan:
    """One scheduling cycle. `state` holds every allocation (build and train); it is not changed.
    `stopping` are jobs preempted earlier that still hold their GPUs during their grace period;
    `departments` cap what their projects use together."""
    rng = rng or random.Random(0)
    work = state.copy()
    plan = Plan()
    usage, over = in_quota_split(projects, running)
    departments = departments or {}
    dept_usage: dict[str, int] = {}
    for j in running:
        d = projects[j.project].department
        dept_usage[d] = dept_usage.get(d, 0) + j.milli
    running_by_id = {j.id: j for j in running}
    preempted: set[str] = set()
    borrowed = {p: max(0, usage.get(p, 0) - projects[p].guarantee_milli) for p in projects}

    def order(job: Job) -> tuple:
        proj = projects[job.project]
        in_quota = usage.get(job.project, 0) + job.milli <= proj.guarantee_milli
        # in-quota first; among borrowers, the least borrowed per weight; then priority, age
        share = 0.0 if in_quota else borrowed.get(job.project, 0) / max(proj.weight, 1e-9)
        return (not in_quota, share, -proj.priority, -job.priority, job.submitted, job.id)

    def count(job: Job) -> None:
        """The job's GPUs count toward its project and department from now on in this cycle."""
        usage[job.project] = usage.get(job.project, 0) + job.milli
        d = projects[job.project].department
        dept_usage[d] = dept_usage.get(d, 0) + job.milli

    queue = sorted(pending, key=order)
    blocked: list[Job] = []
    owed: set[str] = set()  # projects with an in-quota job waiting for GPUs
    while queue:
        job = queue.pop(0)
        proj = projects[job.project]
        used = usage.get(job.project, 0)
        if used + job.milli > proj.cap():
            continue  # over its limit: waits
        dept = departments.get(proj.department)
        if dept is not None and dept_usage.get(dept.name, 0) + job.milli > dept.cap():
            continue  # its department is at its limit
        in_quota = used + job.milli <= proj.guarantee_milli
        if not in_quota and job.project in owed:
            # no borrowing while its own guarantee is being reclaimed: the borrowed job would
            # count first next cycle and push the waiting job over the guarantee, and the
            # GPUs freed for it would go to someone else (preemption churn)
            continue
        placement = _pinned(work, job) or policy.choose(work, job.request, rng)
        if placement is None and in_quota:
            owed.add(job.project)
            if _waits_for_stopping(work, job, stopping or [], policy, rng):
                count(job)
                continue  # GPUs already being freed will do: preempt nobody else
            victims = _reclaim(work, job, projects, running_by_id, over, preempted, now, policy, rng)
            if victims is not None:
                _hold(work, job, victims, policy, rng)
                for v in victims:
                    preempted.add(v.id)
                    plan.preempt.append(Preempt(v.id, job.id, f"project {job.project} needs its guarantee"))
                # the victims keep their GPUs until they have stopped, so nobody else can be
                # admitted onto them in this cycle; next cycle this job, in quota, comes first
                count(job)
            else:
                blocked.append(job)
            continue
        if placement is None:
            continue  # a borrower waits; consolidation is for guarantees
        work.apply(placement)
        plan.admit.append(Admit(job.id, placement))
        count(job)
        borrowed[job.project] = max(0, usage[job.project] - proj.guarantee_milli)
        queue.sort(key=order)  # borrowing changed: re-rank the borrowers
    moving: set[str] = set(preempted)
    for job in blocked[:CONSOLIDATIONS_PER_CYCLE]:  # bounded disruption
        preemptible = {j for j in over if running_by_id[j].project != job.project} - moving
        room = _consolidate(work, job, running_by_id, moving, preemptible, now, policy, rng)
        if room is None:
            continue
        victims, moves = room
        for v in victims:
            moving.add(v.id)
            plan.preempt.append(Preempt(v.id, job.id, f"project {job.project} needs its guarantee"))
        for m in moves:
            moving.add(m.job)
            plan.move.append(m)
        if victims and not moves:  # no pin comes with it: keep the spot as a reclaim does
            _hold(work, job, victims, policy, rng)
    return plan


def _consolidate(work: ClusterState, job: Job, running: dict[str, Job], busy: set[str], preemptible: set[str],
                 now: float, policy: Policy, rng: random.Random) -> tuple[list[Job], list[Move]] | None:
    """Room for a blocked in-quota job on the GPUs of one node when neither free capacity nor
    reclaim alone gives it: the jobs on those GPUs are preempted when they are other projects'
    over-quota jobs (`preemptible`), or moved (consolidation) — and only if every moved job
    fits again elsewhere. The cheapest plan over all nodes (fewest moves, then preemptions),
    or None."""
    req = job.request
    need = req.gpu_milli if req.is_sharing else MILLI_PER_GPU
    on_gpu: dict[tuple[int, int], list[Job]] = {}
    for r in running.values():
        if r.placement is not None:
            i = work.inventory.index_of(r.placement.node)
            for g in r.placement.gpus:
                on_gpu.setdefault((i, g), []).append(r)
    best: tuple[tuple[int, int], list[Job], list[Move]] | None = None
    for i in range(len(work.inventory.nodes)):
        options = []  # per GPU: (moves, preemptions, gpu, jobs to take off it)
        for g in range(int(work.gpu_count[i])):
            free = int(work.gpu_free[i, g])
            if free < 0:
                continue
            off: list[Job] = []
            # preemptible jobs first, then the smallest, until the GPU has room enough
            for r in sorted(on_gpu.get((i, g), []), key=lambda r: (r.id not in preemptible, r.milli, r.id)):
                if free >= need:
                    break
                if r.id in busy or now - (r.started or now) < r.min_runtime_s:
                    continue  # cannot be stopped now
                off.append(r)
                free += r.request.gpu_milli
            if free >= need:
                options.append((sum(r.id not in preemptible for r in off), len(off), g, off))
        k = max(req.num_gpu, 1)
        if len(options) < k:
            continue
        options.sort(key=lambda o: o[:3])
        # one GPU: try each in order of cost; several: the cheapest set
        for chosen in ([[o] for o in options] if k == 1 else [options[:k]]):
            plan = _room_on(work, i, req, chosen, job, preemptible, policy, rng)
            if plan is not None:
                if best is None or plan[0] < best[0]:
                    best = plan
                break
    return None if best is None else (best[1], best[2])


def _room_on(work: ClusterState, i: int, req: Request, chosen: list[tuple], job: Job, preemptible: set[str],
             policy: Policy, rng: random.Random) -> tuple[tuple[int, int], list[Job], list[Move]] | None:
    """Take the jobs off the chosen GPUs of node i: (cost, preempted, moves), or None when the
    job would still not fit or a moved job fits nowhere else."""
    victims = list({r.id: r for o in chosen for r in o[3]}.values())
    if not victims:
        return None  # it fits here as things are: not ours to plan
    trial = work.copy()
    for v in victims:
        trial.release(v.placement)
    gpus = sorted(o[2] for o in chosen)
    if not trial.node_fits(i, req) or any(g not in trial.fitting_gpus(i, req) for g in gpus):
        return None
    target = trial.placement_on(i, req, gpus[: req.num_gpu])
    trial.apply(target)
    moves = []
    for v in victims:
        if v.id in preemptible:
            continue
        spot = policy.choose(trial, v.request, rng)
        if spot is None:
            return None
        trial.apply(spot)
        moves.append(Move(v.id, spot, job.id, target))
    return (len(moves), len(victims) - len(moves)), [v for v in victims if v.id in preemptible], moves


def _pinned(work: ClusterState, job: Job) -> Placement | None:
    """A pending job's planned placement (from a consolidation), if it is free now."""
    p = job.placement
    if p is None:
        return None
    i = work.inventory.index_of(p.node)
    free = work.gpu_free[i]
    if all(0 <= g < len(free) and free[g] >= p.gpu_milli for g in p.gpus) \
            and work.cpu_free[i] >= p.cpu_milli and work.mem_free[i] >= p.memory_mib:
        return p
    return None


def _waits_for_stopping(work: ClusterState, job: Job, stopping: list[Job], policy: Policy,
                        rng: random.Random) -> bool:
    """Would the GPUs of jobs already stopping fit `job`? Then hold them for it."""
    if not stopping:
        return False
    trial = work.copy()
    for s in stopping:
        if s.placement is not None:
            trial.release(s.placement)
    return policy.choose(trial, job.request, rng) is not None


def _reclaim(work: ClusterState, job: Job, projects: dict[str, Project], running: dict[str, Job],
             over: set[str], preempted: set[str], now: float, policy: Policy,
             rng: random.Random) -> list[Job] | None:
    """The fewest over-quota jobs of other projects whose stopping lets `job` fit, or None."""
    candidates = [
        running[j] for j in over
        if j not in preempted and running[j].project != job.project
        and running[j].placement is not None
        and now - (running[j].started or now) >= running[j].min_runtime_s
    ]
    # lowest project priority, then job priority, then the youngest
    candidates.sort(key=lambda j: (projects[j.project].priority, j.priority, -(j.started or 0), j.id))
    trial = work.copy()
    chosen: list[Job] = []
    for victim in candidates:
        trial.release(victim.placement)
        chosen.append(victim)
        if policy.choose(trial, job.request, rng) is not None:
            return _trim(work, job, chosen, policy, rng)
    return None


def _hold(work: ClusterState, job: Job, victims: list[Job], policy: Policy, rng: random.Random) -> None:
    """Keep the free part of the spot `job` will take once its victims stop from anyone else
    in this cycle: otherwise a borrower (often a victim of an earlier cycle) lands there and
    the next cycle must preempt again."""
    trial = work.copy()
    for v in victims:
        trial.release(v.placement)
    spot = policy.choose(trial, job.request, rng)
    if spot is None:
        return
    work.hold(work.inventory.index_of(spot.node), spot.gpus)


def _trim(work: ClusterState, job: Job, chosen: list[Job], policy: Policy, rng: random.Random) -> list[Job]:
    """Drop victims that turned out unnecessary (freed on another node), youngest kept last."""
    needed = list(chosen)
    for victim in list(chosen):
        rest = [v for v in needed if v is not victim]
        trial = work.copy()
        for v in rest:
            trial.release(v.placement)
        if policy.choose(trial, job.request, rng) is not None:
            needed = rest
    return needed


