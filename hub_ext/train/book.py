"""What both training back-ends share: the job rows in the store and the queries on them."""

from __future__ import annotations

import secrets
import time
from collections.abc import Callable
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
        self.pools = cfg.pool_table()  # node pools (gpupool.pool.pools)

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

    def _record_new(self, owner: str, project: str, name: str, num_gpu: int, gpu_milli: int, command: list[str],
                    priority: int, min_runtime_s: float, max_runtime_s: float, files: dict[str, bytes] | None,
                    now: float | None, message: str = "",
                    prepare: Callable[[Path], None] | None = None) -> TrainJob:
        """A new queued job: its folder under jobs_root with the snapshotted code (`prepare`
        may adjust the folder, e.g. hand it to the owner), its row and its event."""
        job_id = secrets.token_hex(6)  # lower-case hex: also a valid Kubernetes name
        workdir = Path(self.cfg.jobs_root.format(username=owner)).resolve() / f"{name}-{job_id}"
        workdir.mkdir(parents=True, exist_ok=False)
        for fname, content in (files or {}).items():
            (workdir / fname).write_bytes(content)
        if prepare is not None:
            prepare(workdir)
        row = TrainJob(id=job_id, owner=owner, project=project, name=name, num_gpu=num_gpu, gpu_milli=gpu_milli,
                       priority=priority, command=command, workdir=str(workdir), state="queued",
                       submitted=now if now is not None else time.time(), min_runtime_s=min_runtime_s,
                       max_runtime_s=max_runtime_s, message=message)
        with self.pool.store.session() as s:
            s.add(row)
        self.pool.store.record("job", f"{owner} submitted job {job_id} ({name}) to {project}", owner=owner,
                               name=job_id)
        return row

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
