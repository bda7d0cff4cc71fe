"""reclaim: give an in-quota job its guarantee back from other projects' over-quota jobs.

First the GPUs of jobs already stopping (their grace period) are counted: when they will do,
nobody else is preempted. Otherwise the victims whose stopping lets the job fit
with the fewest GPU-seconds lost (gpupool.pool.actions.victims.cheapest_victims); the free part of the spot it will take is held for it in this
cycle, so nobody is admitted there while the victims stop.
"""

from __future__ import annotations

from gpupool.pool.actions.cycle import Cycle
from gpupool.pool.actions.victims import cheapest_victims, reclaimable
from gpupool.pool.jobs import Job, Preempt, PreemptCause


def reclaim(cycle: Cycle, job: Job) -> bool:
    """True when the job's room is on its way (stopping jobs, or victims preempted now); the
    job then counts toward its project in this cycle. False: the job is still blocked."""
    if waits_for_stopping(cycle, job):
        cycle.count(job)
        return True  # GPUs already being freed will do: preempt nobody else
    victims = choose_victims(cycle, job)
    if victims is None:
        return False
    hold(cycle, job, victims)
    for v in victims:
        cycle.preempted.add(v.id)
        cycle.plan.preempt.append(
            Preempt(
                v.id,
                job.id,
                f"project {job.project} needs its guarantee",
                PreemptCause.GUARANTEE,
                job.project,
            )
        )
    # the victims keep their GPUs until they have stopped, so nobody else can be admitted onto
    # them in this cycle; next cycle this job, in quota, comes first
    cycle.count(job)
    return True


def waits_for_stopping(cycle: Cycle, job: Job) -> bool:
    """Would the GPUs of jobs already stopping fit `job`?"""
    if not cycle.stopping:
        return False
    trial = cycle.view(job).copy()
    for s in cycle.stopping:
        if s.placement is not None:
            trial.release(s.placement)
    return cycle.policy.choose(trial, job.request, cycle.rng) is not None


def choose_victims(cycle: Cycle, job: Job) -> list[Job] | None:
    """The fewest over-quota jobs of other projects whose stopping lets `job` fit, or None."""
    candidates = reclaimable(
        cycle.running.values(),
        cycle.over,
        cycle.projects,
        cycle.now,
        skip=cycle.preempted,
        not_of=job.project,
    )
    projects = cycle.projects

    def frees(victims) -> bool:
        trial = cycle.view(job).copy()
        for v in victims:
            trial.release(v.placed)
        return cycle.policy.choose(trial, job.request, cycle.rng) is not None

    # the fewest GPU-seconds lost, within the lowest priorities that make room
    return cheapest_victims(
        candidates, frees, cycle.now, tier=lambda j: (projects[j.project].priority, j.priority)
    )


def trim(cycle: Cycle, job: Job, chosen: list[Job]) -> list[Job]:
    """Drop victims that turned out unnecessary (freed on another node), youngest kept last."""
    needed = list(chosen)
    for victim in list(chosen):
        rest = [v for v in needed if v is not victim]
        trial = cycle.view(job).copy()
        for v in rest:
            trial.release(v.placed)
        if cycle.policy.choose(trial, job.request, cycle.rng) is not None:
            needed = rest
    return needed


def hold(cycle: Cycle, job: Job, victims: list[Job]) -> None:
    """Keep the free part of the spot `job` will take once its victims stop from anyone else
    in this cycle: otherwise a borrower (often a victim of an earlier cycle) lands there and
    the next cycle must preempt again."""
    trial = cycle.view(job).copy()
    for v in victims:
        trial.release(v.placed)
    spot = cycle.policy.choose(trial, job.request, cycle.rng)
    if spot is None:
        return
    cycle.work.hold(cycle.work.inventory.index_of(spot.node), spot.gpus)
