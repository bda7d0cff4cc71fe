"""reserve: a big gang job is not starved by a stream of small ones.

A pending in-quota job of several GPUs (all on one node) that has waited `after_s` and still
does not fit gets a node reserved: the node where its GPUs should be free soonest. From then on
the free GPUs of that spot are held for it; only *backfill* may use them — a job that declared a
max runtime ending before the reserved job could start, or a job that borrows beyond its
project's guarantee (another project's, so a reclaim can take it back once the reserved job
could start) while that start is known. The reserved job itself is pinned to the spot, so the reservation stays where it
is from cycle to cycle while the node drains.

When the GPUs will be free: a free GPU now; a GPU of jobs in their grace period now; an
over-quota job of another project once past its min runtime (it can be reclaimed then); any
other job at `started + max_runtime_s`, or never when it declared no max runtime (and a GPU
used by something that is not a train job, a build workspace, never). A spot that is never
free for sure still holds its free GPUs and nothing backfills it: it drains as its runs end.
"""

from __future__ import annotations

import math

from gpupool.pool.actions.cycle import Cycle
from gpupool.pool.actions.reservation import Reservation
from gpupool.pool.jobs import Job, Reserve
from gpupool.pool.units import MILLI_PER_GPU

RESERVATIONS_PER_CYCLE = 4
BORROWER_RESERVATIONS = 1  # at most one node held for a job beyond its guarantee


def reserve(cycle: Cycle, pending: list[Job], after_s: float) -> None:
    work = cycle.work
    taken: set[int] = set()
    planned: dict[str, int] = {}  # GPUs of earlier reserved jobs, per project
    borrowers = 0
    for job in sorted(pending, key=cycle.rank):
        if len(cycle.reservations) >= RESERVATIONS_PER_CYCLE:
            break
        k = job.request.num_gpu
        if k < 2 or cycle.now - job.submitted < after_s or not cycle.within_limits(job):
            continue
        used = cycle.usage.get(job.project, 0) + planned.get(job.project, 0)
        in_quota = used + job.milli <= cycle.projects[job.project].guarantee_milli
        if not in_quota and borrowers >= BORROWER_RESERVATIONS:
            continue
        if cycle.policy.choose(cycle.view(job), job.request, cycle.rng) is not None:
            continue  # it fits now: allocate places it
        spot = _soonest(cycle, job, taken, in_quota)
        if spot is None:
            continue
        i, gpus, start_by = spot
        taken.add(i)
        planned[job.project] = planned.get(job.project, 0) + job.milli
        borrowers += not in_quota
        cycle.reservations[job.id] = Reservation(job.id, job.project, i, gpus, start_by, in_quota)
        placement = work.placement_on(i, job.request, list(gpus))
        cycle.plan.reserve.append(Reserve(job.id, placement, start_by))


def _soonest(
    cycle: Cycle, job: Job, taken: set[int], reclaims: bool
) -> tuple[int, tuple[int, ...], float] | None:
    """(node, GPUs, when they should all be free) of the best spot for `job`: the node whose k
    GPUs free soonest (then the most free now); its pinned spot unless another frees sooner
    for sure (a spot does not wander while nothing is known)."""
    work, k = cycle.view(job), job.request.num_gpu  # its node pools only
    free_at = _free_at(cycle, job.project if reclaims else None)
    models = work.model_mask(job.request)
    kept = None
    pin = job.placement
    if pin is not None:
        i = work.inventory.index_of(pin.node)
        if (
            i not in taken
            and models[i]
            and all(0 <= g < work.gpu_count[i] and work.gpu_free[i, g] >= 0 for g in pin.gpus)
        ):
            kept = i, tuple(pin.gpus), max(free_at.get((i, g), math.inf) for g in pin.gpus)
    best = None
    for i in range(len(work.inventory.nodes)):
        if i in taken or not models[i] or work.gpu_count[i] < k:
            continue
        times = sorted(
            (free_at.get((i, g), math.inf), g)
            for g in range(int(work.gpu_count[i]))
            if work.gpu_free[i, g] >= 0
        )
        if len(times) < k:
            continue
        start_by = times[k - 1][0]
        free_now = sum(1 for t, _ in times if t <= cycle.now)
        key = (start_by, -free_now, i)
        if best is None or key < best[0]:
            best = (key, i, tuple(sorted(g for _, g in times[:k])), start_by)
    if kept is not None and (best is None or kept[2] <= best[3]):
        return kept
    return None if best is None else best[1:]


def _free_at(cycle: Cycle, project: str | None) -> dict[tuple[int, int], float]:
    """When each GPU should be free for a job of `project` (see the module's docstring); None:
    for a borrower, which reclaims nothing."""
    work, now = cycle.work, cycle.now
    on_gpu: dict[tuple[int, int], list[tuple[int, float]]] = {}

    def add(j: Job, t: float) -> None:
        i = work.inventory.index_of(j.placed.node)
        for g in j.placed.gpus:
            on_gpu.setdefault((i, g), []).append((j.request.gpu_milli, t))

    for j in cycle.stopping:
        if j.placement is not None:
            add(j, now)
    for j in cycle.running.values():
        if j.placement is None:
            continue
        started = now if j.started is None else j.started
        if project is not None and j.id in cycle.over and j.project != project:
            t = max(now, started + j.min_runtime_s)
        elif j.max_runtime_s > 0:
            t = max(now, started + j.max_runtime_s)
        else:
            t = math.inf
        add(j, t)
    out: dict[tuple[int, int], float] = {}
    for i in range(len(work.inventory.nodes)):
        for g in range(int(work.gpu_count[i])):
            free = int(work.gpu_free[i, g])
            if free < 0:
                continue
            jobs = on_gpu.get((i, g), [])
            if MILLI_PER_GPU - free > sum(m for m, _ in jobs):
                out[(i, g)] = math.inf  # held by something else (a build workspace)
            else:
                out[(i, g)] = max([t for _, t in jobs], default=now)
    return out
