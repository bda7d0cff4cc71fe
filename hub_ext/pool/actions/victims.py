"""The one victim ordering: which over-quota train job stops first, for a reclaim by another
project and for a build workspace that needs its GPU (the training service)."""

from __future__ import annotations

from collections.abc import Iterable
from collections.abc import Set as AbstractSet

from gpupool.pool.jobs import Job, Project


def victim_key(projects: dict[str, Project]):
    """Lowest project priority first, then lowest job priority, then the youngest run."""
    return lambda j: (projects[j.project].priority, j.priority, -(j.started or 0), j.id)


def reclaimable(
    running: Iterable[Job],
    over: set[str],
    projects: dict[str, Project],
    now: float,
    skip: AbstractSet[str] = frozenset(),
    not_of: str | None = None,
) -> list[Job]:
    """Over-quota running jobs past their min runtime, in victim order; `skip` are already
    chosen, `not_of` a project whose own jobs are not candidates (a reclaim is for another
    project's guarantee)."""
    candidates = [
        j
        for j in running
        if j.id in over
        and j.id not in skip
        and j.project != not_of
        and j.placement is not None
        and now - (j.started or now) >= j.min_runtime_s
    ]
    return sorted(candidates, key=victim_key(projects))
