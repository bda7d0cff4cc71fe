"""Train scheduling with guaranteed quotas: pure, `now` is an argument.

Each call to `schedule` runs the named actions of `gpupool.pool.actions` (reserve, allocate,
reclaim, shrink, preempt, consolidate, expand) and returns their plan, like KAI-Scheduler and
Kueue: `admit` (start a job on a placement), `preempt` (stop an over-quota job so that its GPUs
go back to a project that needs its guarantee), `move`, `reserve` and `resize`. The caller
carries them out.

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

from gpupool.pool.actions import (
    CONSOLIDATIONS_PER_CYCLE,
    Cycle,
    allocate,
    consolidate,
    expand,
    preempt,
    reclaim,
    reserve,
    shrink,
)
from gpupool.pool.jobs import (
    Admit,
    Department,
    Job,
    Move,
    Plan,
    Preempt,
    Project,
    Reserve,
    Resize,
    in_quota_split,
)
from gpupool.pool.placement import Policy
from gpupool.pool.pool_quotas import split_by_pool
from gpupool.pool.pools import NodePool
from gpupool.pool.state import ClusterState

__all__ = [
    "CONSOLIDATIONS_PER_CYCLE",
    "Admit",
    "Department",
    "Job",
    "Move",
    "Plan",
    "Preempt",
    "Project",
    "Reserve",
    "Resize",
    "in_quota_split",
    "schedule",
]


def schedule(
    state: ClusterState,
    projects: dict[str, Project],
    pending: list[Job],
    running: list[Job],
    now: float,
    policy: Policy,
    rng: random.Random | None = None,
    stopping: list[Job] | None = None,
    departments: dict[str, Department] | None = None,
    reserve_after_s: float | None = None,
    pools: dict[str, NodePool] | None = None,
) -> Plan:
    """One scheduling cycle. `state` holds every allocation (build and train); it is not changed.
    `stopping` are jobs preempted earlier that still hold their GPUs during their grace period;
    `departments` cap what their projects use together; `reserve_after_s` (None: never) is how
    long an in-quota gang job waits before a node is reserved for it; `pools` are the node pools
    jobs name in `Job.pools`. A project with a guarantee per pool is split into its per-pool
    parts first (`gpupool.pool.pool_quotas`)."""
    if pools and any(p.pool_guarantees for p in projects.values()):
        projects, pending, running, stopping = split_by_pool(
            projects, pools, state.inventory, pending, running, stopping
        )
    cycle = Cycle(
        state, projects, running, now, policy, rng or random.Random(0), stopping, departments, pools
    )
    if reserve_after_s is not None:
        reserve(cycle, pending, reserve_after_s)
    allocate(
        cycle,
        pending,
        make_room=lambda job: shrink(cycle, job) or reclaim(cycle, job) or preempt(cycle, job),
        make_room_in_project=lambda job: preempt(cycle, job),
    )
    consolidate(cycle)
    expand(cycle, pending)
    return cycle.plan
