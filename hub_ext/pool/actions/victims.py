"""The one victim ordering: which over-quota train job stops first, for a reclaim by another
project and for a build workspace that needs its GPU (the training service)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
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


# Exact search over every subset up to this many candidates (1,024 fit checks at most); above
# it, cheapest-first then dropping the dearest unneeded victims, which is not always optimal.
EXACT_UP_TO = 10


def lost_gpu_s(job: Job, now: float) -> float:
    """GPU-seconds of work a stop throws away: the job's GPUs times its run so far. A stopped
    job resumes from its last checkpoint, and the last the hub knows of is the run's start."""
    return job.milli * max(0.0, now - (job.started if job.started is not None else now)) / 1000


def cheapest_victims(
    candidates: Sequence[Job],
    frees: Callable[[Sequence[Job]], bool],
    now: float,
    tier: Callable[[Job], tuple[int, int]] = lambda j: (0, 0),  # (project priority, job priority)
) -> list[Job] | None:
    """The victims of a reclaim: of the candidates (in the one victim order), the set whose
    stopping makes room (`frees`) and loses the fewest GPU-seconds; equal losses go to the set
    with less progress since its checkpoints (seconds run), then to fewer jobs, then to the
    victim order. Only the lowest priority tiers (`tier`) that can make room are touched. None
    when even every candidate does not make room. Before, victims were taken youngest first
    until the room fitted: a 2-GPU job stopped where a 1-GPU job started in the same tick would do."""
    levels = sorted({tier(j) for j in candidates})
    for level in levels:
        pool = [j for j in candidates if tier(j) <= level]
        if frees(pool):
            return _cheapest(pool, frees, now)
    return None


def _cost(jobs: Sequence[Job], order: dict[str, int], now: float) -> tuple[object, ...]:
    run_s = sum(max(0.0, now - (j.started if j.started is not None else now)) for j in jobs)
    return (sum(lost_gpu_s(j, now) for j in jobs), run_s, len(jobs), sorted(order[j.id] for j in jobs))


def _cheapest(pool: list[Job], frees: Callable[[Sequence[Job]], bool], now: float) -> list[Job]:
    order = {j.id: i for i, j in enumerate(pool)}
    if len(pool) <= EXACT_UP_TO:
        subsets = [[j for i, j in enumerate(pool) if mask >> i & 1] for mask in range(1, 1 << len(pool))]
        subsets.sort(key=lambda s: _cost(s, order, now))
        return next(s for s in subsets if frees(s))  # the whole pool frees: one always does
    chosen: list[Job] = []
    for j in sorted(pool, key=lambda j: _cost([j], order, now)):
        chosen.append(j)
        if frees(chosen):
            break
    for j in sorted(chosen, key=lambda j: _cost([j], order, now), reverse=True):
        rest = [v for v in chosen if v is not j]
        if frees(rest):
            chosen = rest
    return chosen
