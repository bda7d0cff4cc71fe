"""One project with a guarantee per node pool (e.g. `vision`: 4 GPUs on `dgx`, 2 on
`workstations`), as the scheduling actions see it. Pure.

Before a cycle, such a project is split into *parts*: one per pool with a guarantee
("vision (pool dgx)", that pool's guarantee, that pool alone) and the project itself as the
remainder (guarantee 0, all its pools) for what borrows. Every action then works unchanged:
a reclaim for the dgx part takes over-quota GPUs in dgx only; within a part the highest
priorities fill its guarantee first; the project's limit caps its parts together (`parent`).

- a running job belongs to the part of the first guaranteed pool that holds all its GPUs
  (else the remainder);
- a pending job goes, in queue order, to the first of its pools where it is within that
  pool's guarantee counting its part's work of its priority or higher (running, and pending
  ahead of it), so it may reclaim there, or preempt its own lower priorities there; otherwise
  to the remainder, where it borrows in its pools' order.
"""

from __future__ import annotations

from dataclasses import replace

from gpupool.pool.inventory import Inventory
from gpupool.pool.jobs import Job, Project
from gpupool.pool.pools import NodePool


def part_name(project: str, pool: str) -> str:
    return f"{project} (pool {pool})"


def parts_of(project: Project) -> dict[str, Project]:
    """The per-pool parts of `project` and its remainder, by name (itself when it has no
    per-pool guarantees)."""
    if not project.pool_guarantees:
        return {project.name: project}
    out = {
        part_name(project.name, pool): replace(
            project,
            name=part_name(project.name, pool),
            guarantee_milli=g,
            pools=(pool,),
            pool_guarantees=(),
            parent=project.name,
        )
        for pool, g in project.pool_guarantees
    }
    out[project.name] = replace(project, guarantee_milli=0, pool_guarantees=(), parent=project.name)
    return out


def in_pool(pool: NodePool | None, inventory: Inventory, job: Job) -> bool:
    """Are all of the running job's GPUs in `pool`?"""
    p = job.placement
    if pool is None or p is None:
        return False
    try:
        node = inventory.node(p.node)
    except KeyError:
        return False
    return all(
        0 <= g < len(node.gpus) and pool.has(node.name, node.gpus[g].index, node.gpus[g].model)
        for g in p.gpus
    )


def split_by_pool(
    projects: dict[str, Project],
    pools: dict[str, NodePool],
    inventory: Inventory,
    pending: list[Job],
    running: list[Job],
    stopping: list[Job] | None = None,
) -> tuple[dict[str, Project], list[Job], list[Job], list[Job]]:
    """Projects, pending, running and stopping jobs with every per-pool project split into its
    parts (see the module's text). Nothing changes when no project has per-pool guarantees."""
    stopping = stopping or []
    if not any(p.pool_guarantees for p in projects.values()):
        return projects, pending, running, stopping
    out: dict[str, Project] = {}
    for p in projects.values():
        out.update(parts_of(p))

    def running_part(job: Job) -> Job:
        proj = projects.get(job.project)
        if proj is None or not proj.pool_guarantees:
            return job
        for pool, _ in proj.pool_guarantees:
            if in_pool(pools.get(pool), inventory, job):
                return replace(job, project=part_name(proj.name, pool))
        return job  # the remainder: it borrows

    running2 = [running_part(j) for j in running]
    stopping2 = [running_part(j) for j in stopping]
    pending2: list[Job] = []
    for job in sorted(pending, key=lambda j: (-j.priority, j.submitted, j.id)):
        proj = projects.get(job.project)
        if proj is None or not proj.pool_guarantees:
            pending2.append(job)
            continue
        guarantees = dict(proj.pool_guarantees)
        chosen = job.pools or proj.pools
        # a job pinned to a spot (a reservation, a consolidation) tries that spot's pool first,
        # so that it is not seen through another pool that hides its spot
        pin = [p for p in chosen if in_pool(pools.get(p), inventory, job)]
        for pool in [*pin[:1], *(p for p in chosen if p not in pin[:1])]:
            if pool not in guarantees:
                continue
            part = part_name(proj.name, pool)
            used = sum(
                j.milli for j in (*running2, *pending2) if j.project == part and j.priority >= job.priority
            )
            if used + job.milli <= guarantees[pool]:
                pending2.append(replace(job, project=part, pools=(pool,)))
                break
        else:
            pending2.append(replace(job, pools=tuple(chosen)))
    return out, pending2, running2, stopping2


def queue_pool(
    project: Project, chosen: tuple[str, ...], used_by_pool: dict[str, int], milli: int
) -> str | None:
    """Where a job goes where the cluster's scheduler decides inside one queue per pool
    (Kubernetes: KAI's queues of a project with a guarantee per pool): the first of its pools
    (`chosen`, else its project's) that has a guarantee and where the job is within it,
    counting `used_by_pool` (what the project's jobs hold or wait for there); else the first
    of its pools that has a guarantee, where it borrows. None for a project without a guarantee
    per pool; ValueError when none of the job's pools has one (no queue to wait in)."""
    if not project.pool_guarantees:
        return None
    guarantees = dict(project.pool_guarantees)
    order = [p for p in (chosen or project.pools) if p in guarantees]
    if not order:
        raise ValueError(
            f"project {project.name} has a guarantee only in {sorted(guarantees)}: a job must be"
            " able to use one of them"
        )
    for pool in order:
        if used_by_pool.get(pool, 0) + milli <= guarantees[pool]:
            return pool
    return order[0]
