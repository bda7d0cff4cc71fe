"""A reservation held for a big gang job (see reserve.py), and who may backfill it."""

from __future__ import annotations

from dataclasses import dataclass

from gpupool.pool.jobs import Job


@dataclass(frozen=True)
class Reservation:
    job: str
    project: str
    node: int
    gpus: tuple[int, ...]
    start_by: float  # when its GPUs should all be free (inf: not known)
    in_quota: bool = True  # the reserved job is within its project's guarantee

    def backfills(self, job: Job, now: float, in_quota: bool) -> bool:
        """May `job` use the reserved GPUs? If it ends before the reserved job could start. For
        an in-quota reservation also another project's borrower (reclaimable once past its min
        runtime), but only while that start is known: a borrower turns in-quota when its
        project's older jobs end, and with no known start a stream of them would keep the spot
        forever. For a borrower's reservation every in-quota job: guarantees come first."""
        if job.id == self.job:
            return True
        if job.max_runtime_s > 0 and now + job.max_runtime_s <= self.start_by:
            return True
        if not self.in_quota:
            return in_quota
        return (
            job.project != self.project
            and not in_quota
            and self.start_by != float("inf")
            and now + job.min_runtime_s <= self.start_by
        )
