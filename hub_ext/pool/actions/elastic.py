"""Elastic jobs (min_gpus to max_gpus whole GPUs on one node): allocate starts one with the
largest size that fits; these two actions change the size of running ones, each by restarting
the job from its checkpoint at the new size (a `Resize`):

- shrink: before an in-quota job is refused, and before reclaim stops whole jobs for it, other
  projects' elastic jobs give back their GPUs above their minimum — in the one victim order,
  past their min runtime (unless GPUs already being freed will do);
- expand: when every pending job has been placed in this cycle, a running elastic job below
  its maximum grows onto free GPUs of its own node (within its project's limits), the
  fewest-GPU one first; at most one per cycle, so a restart is never wasted on a flapping size.
"""

from __future__ import annotations

from dataclasses import replace

from gpupool.pool.actions.cycle import Cycle
from gpupool.pool.actions.reclaim import waits_for_stopping
from gpupool.pool.actions.victims import victim_key
from gpupool.pool.jobs import Job, Resize
from gpupool.pool.request import Request

GROWTHS_PER_CYCLE = 1


def shrink(cycle: Cycle, job: Job) -> bool:
    """Room for in-quota `job` from elastic jobs of other projects shrunk to their minimum."""
    if waits_for_stopping(cycle, job):
        return False  # reclaim counts it: nobody needs to shrink
    candidates = sorted(
        (
            r
            for r in cycle.running.values()
            if r.elastic
            and r.project != job.project
            and r.placement is not None
            and r.request.num_gpu > r.min_gpus
            and r.id not in cycle.preempted
            and cycle.can_stop(r)
        ),
        key=victim_key(cycle.projects),
    )
    # shrink on the whole pool (an elastic job may sit outside `job`'s node pools), then look
    # with `job`'s eyes whether it fits
    trial = cycle.work.copy()
    chosen = []
    for r in candidates:
        i = trial.inventory.index_of(r.placed.node)
        smaller = trial.placement_on(i, Request(r.min_gpus), list(r.placed.gpus[: r.min_gpus]))
        trial.release(r.placed)
        trial.apply(smaller)
        chosen.append((r, smaller))
        spot = cycle.policy.choose(cycle.seen_by(trial, job), job.request, cycle.rng)
        if spot is not None:
            # the GPUs given back are held for `job` in this cycle, as a reclaim holds its spot
            cycle.work.hold(cycle.work.inventory.index_of(spot.node), spot.gpus)
            for r, to in chosen:
                cycle.preempted.add(r.id)
                cycle.plan.resize.append(
                    Resize(
                        r.id, to, f"shrunk to {r.min_gpus} GPUs: project {job.project} needs its guarantee"
                    )
                )
            cycle.count(job)
            return True
    return False


def expand(cycle: Cycle, pending: list[Job]) -> None:
    admitted = {a.job for a in cycle.plan.admit}
    if any(j.id not in admitted for j in pending):
        return  # GPUs go to waiting jobs first
    grown = 0
    for r in sorted(cycle.running.values(), key=lambda j: (j.request.num_gpu, j.started or 0, j.id)):
        if grown >= GROWTHS_PER_CYCLE:
            return
        if (
            not r.elastic
            or r.placement is None
            or r.request.num_gpu >= r.max_gpus
            or r.id in cycle.preempted
            or not cycle.can_stop(r)
        ):
            continue
        view = cycle.view(r)
        i = view.inventory.index_of(r.placement.node)
        free = [
            g
            for g in range(int(view.gpu_count[i]))
            if view.gpu_free[i, g] == 1000 and g not in r.placement.gpus
        ]
        for k in range(min(r.max_gpus, r.request.num_gpu + len(free)), r.request.num_gpu, -1):
            bigger = replace(r, request=Request(k - r.request.num_gpu))
            if not cycle.within_limits(bigger):  # the extra GPUs count on top of what it runs
                continue
            gpus = sorted([*r.placement.gpus, *free[: k - r.request.num_gpu]])
            to = view.placement_on(i, Request(k), gpus)
            cycle.work.hold(i, tuple(free[: k - r.request.num_gpu]))  # nobody else takes them meanwhile
            cycle.preempted.add(r.id)
            cycle.plan.resize.append(Resize(r.id, to, f"grown to {k} GPUs: they were idle"))
            cycle.count(bigger)
            grown += 1
            break
