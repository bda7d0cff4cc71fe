"""What both training back-ends share: the job rows in the store and the queries on them."""

from __future__ import annotations

from pathlib import Path

from sqlalchemy import select

from ..manager import PoolManager
from ..pool.training import Department, Project
from ..store import TrainJob
from .config import TrainPool


class JobBook:
    def __init__(self, pool: PoolManager, cfg: TrainPool) -> None:
        self.pool, self.cfg = pool, cfg
        self.projects: dict[str, Project] = cfg.project_table()
        self.departments: dict[str, Department] = cfg.department_table()

    def jobs(self, **filters) -> list[TrainJob]:
        with self.pool.store.session() as s:
            q = select(TrainJob).filter_by(**filters).order_by(TrainJob.submitted)
            return list(s.scalars(q))

    def job(self, job_id: str) -> TrainJob | None:
        with self.pool.store.session() as s:
            return s.get(TrainJob, job_id)

    def queue_position(self, job_id: str) -> int | None:
        queued = [j.id for j in self.jobs(state="queued")]
        return queued.index(job_id) + 1 if job_id in queued else None

    def _set(self, job_id: str, **values) -> None:
        with self.pool.store.session() as s:
            row = s.get(TrainJob, job_id)
            for k, v in values.items():
                setattr(row, k, v)

    async def logs(self, row: TrainJob, tail: int) -> dict:
        """The last `tail` lines of the job's log and its output notebook, if any."""
        log = Path(row.workdir, "job.log")
        text = log.read_text(errors="replace") if log.exists() else ""
        output = Path(row.workdir, "output.ipynb")
        return {"lines": text.splitlines()[-tail:], "output_notebook": str(output) if output.exists() else None}
