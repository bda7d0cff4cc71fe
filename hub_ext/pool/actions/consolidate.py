"""consolidate: room for in-quota jobs still blocked after reclaim (fragmentation, or borrowed
and in-quota shares mixed on every GPU).

The jobs on the GPUs a blocked job needs on one node are taken off: other projects' over-quota
jobs are preempted, the rest (past their min runtime) moved — only if every moved job fits
again elsewhere. The cheapest plan over all nodes wins (fewest moves, then preemptions); the
moved jobs and the blocked job are pinned to the planned spots. At most
CONSOLIDATIONS_PER_CYCLE per cycle: bounded disruption.
"""

from __future__ import annotations

from typing import Any

from gpupool.pool.actions.cycle import Cycle
from gpupool.pool.actions.reclaim import hold
from gpupool.pool.jobs import Job, Move, Preempt, PreemptCause
from gpupool.pool.request import Request
from gpupool.pool.state import ClusterState
from gpupool.pool.units import MILLI_PER_GPU

CONSOLIDATIONS_PER_CYCLE = 3


def consolidate(cycle: Cycle) -> None:
    moving: set[str] = set(cycle.preempted)
    for job in cycle.blocked[:CONSOLIDATIONS_PER_CYCLE]:
        preemptible = {j for j in cycle.over if cycle.running[j].project != job.project} - moving
        room = plan_room(cycle, job, moving, preemptible)
        if room is None:
            continue
        victims, moves = room
        for v in victims:
            moving.add(v.id)
            cycle.plan.preempt.append(
                Preempt(
                    v.id,
                    job.id,
                    f"project {job.project} needs its guarantee",
                    PreemptCause.GUARANTEE,
                    job.project,
                )
            )
        for m in moves:
            moving.add(m.job)
            cycle.plan.move.append(m)
        if victims and not moves:  # no pin comes with it: keep the spot as a reclaim does
            hold(cycle, job, victims)


def plan_room(
    cycle: Cycle, job: Job, busy: set[str], preemptible: set[str]
) -> tuple[list[Job], list[Move]] | None:
    """The cheapest (victims, moves) that empties the GPUs `job` needs on one node, or None."""
    work = cycle.view(job)
    req = job.request
    need = req.gpu_milli if req.is_sharing else MILLI_PER_GPU
    on_gpu: dict[tuple[int, int], list[Job]] = {}
    for r in cycle.running.values():
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
                if r.id in busy or not cycle.can_stop(r):
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
        for chosen in [[o] for o in options] if k == 1 else [options[:k]]:
            plan = _room_on(cycle, work, i, req, chosen, job, preemptible)
            if plan is not None:
                if best is None or plan[0] < best[0]:
                    best = plan
                break
    return None if best is None else (best[1], best[2])


def _room_on(
    cycle: Cycle,
    work: ClusterState,
    i: int,
    req: Request,
    chosen: list[tuple[Any, ...]],
    job: Job,
    preemptible: set[str],
) -> tuple[tuple[int, int], list[Job], list[Move]] | None:
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
    # the moved jobs land where they themselves may go (`work` is what the blocked job may use)
    if work is not cycle.work:
        trial = cycle.work.copy()
        for v in victims:
            trial.release(v.placement)
    trial.apply(target)
    moves = []
    for v in victims:
        if v.id in preemptible:
            continue
        spot = cycle.policy.choose(cycle.seen_by(trial, v), v.request, cycle.rng)
        if spot is None:
            return None
        trial.apply(spot)
        moves.append(Move(v.id, spot, job.id, target))
    return (len(moves), len(victims) - len(moves)), [v for v in victims if v.id in preemptible], moves
