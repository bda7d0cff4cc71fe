"""A reservation held for a big gang job (see reserve.py), and who may backfill it."""

from __future__ import annotations

from dataclasses import dataclass

from ..jobs import Job


@dataclass(frozen=True)
class Reservation:
    job: str
    project: str
    node: int
    gpus: tuple[int, ...]
    start_by: float  # when its GPUs should all be free (inf: not known)

    def backfills(self, job: Job, now: float, in_quota: bool) -> bool:
        """May `job` use the reserved GPUs? Only if it ends before the reserved job could start,
        or it borrows (another project's job, reclaimable once past its min runtime) and that
        start is known: a borrower turns in-quota when its project's older jobs end, and with
        no known start a stream of them would keep the spot forever."""
        if job.id == self.job:
            return True
        if job.max_runtime_s > 0 and now + job.max_runtime_s <= self.start_by:
            return True
        return (job.project != self.project and not in_quota and self.start_by != float("inf")
                and now + job.min_runtime_s <= self.start_by)
