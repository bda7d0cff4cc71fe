"""preempt: priorities inside a project (KAI-Scheduler's preempt action, within one queue).

A pending job that does not fit may stop its own project's running jobs of *lower* priority
(the lowest first, then the youngest; past their min runtime), when it would be within the
project's guarantee counting only the project's work of its priority or higher. Higher-priority
work owns the guarantee first; nothing of another project is touched (that is reclaim).
"""

from __future__ import annotations

from gpupool.pool.actions.cycle import Cycle
from gpupool.pool.actions.reclaim import hold, trim, waits_for_stopping
from gpupool.pool.actions.victims import victim_key
from gpupool.pool.jobs import Job, Preempt, PreemptCause


def preempt(cycle: Cycle, job: Job) -> bool:
    """True when room for `job` is on its way (stopping jobs, or victims preempted now)."""
    if not cycle.in_quota_at_priority(job):
        return False
    candidates = [
        r
        for r in cycle.running.values()
        if r.project == job.project
        and r.priority < job.priority
        and r.placement is not None
        and r.id not in cycle.preempted
        and cycle.can_stop(r)
    ]
    if not candidates:
        return False
    if waits_for_stopping(cycle, job):
        cycle.count(job)
        return True  # lower-priority jobs preempted earlier are still stopping: no new victims
    trial = cycle.view(job).copy()
    chosen: list[Job] = []
    for victim in sorted(candidates, key=victim_key(cycle.projects)):
        trial.release(victim.placed)
        chosen.append(victim)
        if cycle.policy.choose(trial, job.request, cycle.rng) is not None:
            victims = trim(cycle, job, chosen)
            hold(cycle, job, victims)
            for v in victims:
                cycle.preempted.add(v.id)
                cycle.plan.preempt.append(
                    Preempt(
                        v.id,
                        job.id,
                        f"a job of priority {job.priority} in {job.project} needs its GPUs",
                        PreemptCause.PRIORITY,
                        job.project,
                    )
                )
            cycle.count(job)
            return True
    return False
