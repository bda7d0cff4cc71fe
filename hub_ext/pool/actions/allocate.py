"""allocate: walk the queue in order and admit every job that fits on free capacity.

An in-quota job that does not fit is handed to `make_room` (reclaim, then preempt); any other
job that does not fit to `make_room_in_project` (preempt), else it waits. The queue is re-ranked after each admission because borrowing changed.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from gpupool.pool.actions.cycle import Cycle
from gpupool.pool.jobs import Admit, Job
from gpupool.pool.request import Placement, Request
from gpupool.pool.state import ClusterState


def allocate(
    cycle: Cycle,
    pending: list[Job],
    make_room: Callable[[Job], bool],
    make_room_in_project: Callable[[Job], bool] = lambda job: False,
) -> None:
    """`make_room` is for an in-quota job that does not fit (reclaim, then preempt);
    `make_room_in_project` for any other job (preempt: its own project's lower priorities)."""
    queue = sorted(pending, key=cycle.rank)
    while queue:
        job = queue.pop(0)
        if not cycle.within_limits(job):
            continue  # over its project's or department's limit: waits
        in_quota = cycle.in_quota(job)
        if not in_quota and job.project in cycle.owed:
            # no borrowing while its own guarantee is being reclaimed: the borrowed job would
            # count first next cycle and push the waiting job over the guarantee, and the
            # GPUs freed for it would go to someone else (preemption churn)
            continue
        view = cycle.view(job)  # reserved GPUs held unless it may backfill them; its pools only
        placement = pinned(view, job)
        if placement is not None and job.elastic:
            job = replace(job, request=Request(len(placement.gpus)))  # the size it was resized to
        for sized in sizes(cycle, job) if placement is None else ():  # an elastic job: the largest that fits
            placement = place(cycle, sized, view)
            if placement is not None:
                job = sized
                break
        if placement is None:
            if in_quota:
                cycle.owed.add(job.project)
                if not make_room(job):
                    cycle.blocked.append(job)
            elif make_room_in_project(job):
                cycle.owed.add(job.project)  # its project does not borrow while its room is freed
            continue  # otherwise a borrower waits; consolidation is for guarantees
        admit(cycle, job, placement)
        queue.sort(key=cycle.rank)  # borrowing changed: re-rank the borrowers


def sizes(cycle: Cycle, job: Job) -> list[Job]:
    """The sizes to try: the job's request; an elastic job from its max down to its min, as far
    as its project's and department's limits go."""
    if not job.elastic:
        return [job]
    out = []
    for k in range(job.max_gpus, job.request.num_gpu - 1, -1):
        sized = replace(job, request=Request(k))
        if k == job.request.num_gpu or cycle.within_limits(sized):
            out.append(sized)
    return out


def place(cycle: Cycle, job: Job, view: ClusterState) -> Placement | None:
    """Free room for `job`: in its node pools, in their order of preference, else anywhere."""
    pools = cycle.pools_of(job)
    for pool in pools:
        placement = cycle.policy.choose(cycle.view(job, pool), job.request, cycle.rng)
        if placement is not None:
            return placement
    return None if pools else cycle.policy.choose(view, job.request, cycle.rng)


def admit(cycle: Cycle, job: Job, placement: Placement) -> None:
    cycle.work.apply(placement)
    cycle.plan.admit.append(Admit(job.id, placement))
    cycle.count(job)


def pinned(work: ClusterState, job: Job) -> Placement | None:
    """A pending job's planned placement (from a consolidation or a reservation), if it is free now."""
    p = job.placement
    if p is None:
        return None
    i = work.inventory.index_of(p.node)
    free = work.gpu_free[i]
    if (
        all(0 <= g < len(free) and free[g] >= p.gpu_milli for g in p.gpus)
        and work.cpu_free[i] >= p.cpu_milli
        and work.mem_free[i] >= p.memory_mib
    ):
        return p
    return None
