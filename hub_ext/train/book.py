"""What both training back-ends share: the job rows in the store and the queries on them."""

from __future__ import annotations

import asyncio
import errno
import os
import secrets
import stat
import time
from collections.abc import Callable
from pathlib import Path

from sqlalchemy import select

from gpupool.alloc.manager import PoolManager
from gpupool.pool.training import Department, Project
from gpupool.runners.safe_files import UnsafePath, folder, is_file, open_file, tail_lines
from gpupool.store import Event, TrainJob
from gpupool.store.db import bounded
from gpupool.train.backend import JobLog
from gpupool.train.config import TrainPool
from gpupool.train.folders import remove_folder, user_jobs_folder
from gpupool.train.request import JobRequest
from gpupool.vocab.states import JobEvent, JobState


class JobBook:
    def __init__(
        self,
        pool: PoolManager,
        cfg: TrainPool,
        holds: Callable[[list[TrainJob]], dict[str, str]] | None = None,
    ) -> None:
        self.pool, self.cfg = pool, cfg
        self.projects: dict[str, Project] = cfg.project_table()
        self.departments: dict[str, Department] = cfg.department_table()
        self.pools = cfg.pool_table()  # node pools (gpupool.pool.pools)
        # from usage accounting: queued jobs held by a GPU-hour budget (job id -> why), which
        # the scheduler leaves waiting (gpupool.usage.service.UsageService.held_jobs)
        self.holds = holds

    def jobs(self, **filters) -> list[TrainJob]:
        with self.pool.store.session() as s:
            q = select(TrainJob).filter_by(**filters).order_by(TrainJob.submitted)
            return list(s.scalars(q))

    def job(self, job_id: str) -> TrainJob | None:
        with self.pool.store.session() as s:
            return s.get(TrainJob, job_id)

    def known_job(self, job_id: str) -> TrainJob:
        """A job this code has just read or written: its row missing is a bug (NoResultFound)."""
        with self.pool.store.session() as s:
            return s.get_one(TrainJob, job_id)

    def queue_position(self, job_id: str) -> int | None:
        queued = [j.id for j in self.jobs(state=JobState.QUEUED)]
        return queued.index(job_id) + 1 if job_id in queued else None

    def _record_new(
        self,
        job: JobRequest,
        command: list[str],
        now: float | None,
        *,
        message: str = "",
        pools: tuple[str, ...] | None = None,
        prepare: Callable[[Path], None] | None = None,
    ) -> TrainJob:
        """A new queued job, one row from one request: its folder under jobs_root with the
        snapshotted code (`prepare` may adjust the folder, e.g. hand it to the owner), its row
        (`command` as the back-end runs the code; `pools` when the back-end chose among the
        request's) and its event."""
        owner, name = job.owner, job.name
        job_id = secrets.token_hex(6)  # lower-case hex: also a valid Kubernetes name
        parent = user_jobs_folder(self.cfg.jobs_root, owner)
        make_job_folders(parent)
        workdir = parent / f"{name}-{job_id}"
        with folder(str(parent), _parent_owner(parent)) as parent_fd:
            os.mkdir(workdir.name, 0o700, dir_fd=parent_fd)
        try:
            with folder(str(workdir), os.geteuid()) as dir_fd:
                for fname, content in job.code.files.items():
                    fd = open_file(dir_fd, fname, os.O_WRONLY, os.geteuid(), create=True)
                    with os.fdopen(fd, "wb") as f:
                        f.write(content)
            if prepare is not None:
                prepare(workdir)
            row = TrainJob(
                id=job_id,
                owner=owner,
                project=job.project,
                name=name,
                num_gpu=job.num_gpu,
                gpu_milli=job.gpu_milli,
                priority=job.priority,
                command=command,
                workdir=str(workdir),
                state=JobState.QUEUED,
                submitted=now if now is not None else time.time(),
                min_runtime_s=job.min_runtime_s,
                max_runtime_s=job.max_runtime_s,
                min_gpus=job.min_gpus,
                max_gpus=job.num_gpu if job.min_gpus else 0,
                pools=list(job.pools if pools is None else pools),
                sweep_id=job.sweep_id,
                sweep_parameters=None if job.sweep_parameters is None else dict(job.sweep_parameters),
                message=message,
            )
            with self.pool.store.session() as s:
                s.add(row)
                s.add(
                    Event(
                        kind=JobEvent.SUBMITTED,
                        message=f"{owner} submitted job {job_id} ({name}) to {job.project}",
                        owner=owner,
                        name=job_id,
                        data={},
                    )
                )
        except BaseException:
            # a full disk (ENOSPC writing the code, or the database refusing the row) leaves no
            # folder of a job that never was: it would take more of that disk, for nobody
            remove_folder(str(workdir))
            raise
        return row

    def _set(self, job_id: str, **values) -> None:
        if "message" in values:
            values["message"] = bounded(values["message"])
        with self.pool.store.session() as s:
            row = s.get_one(TrainJob, job_id)
            for k, v in values.items():
                setattr(row, k, v)

    def file_owner(self, owner: str) -> int:
        """The uid that owns a job's files (the hub's own unless jobs run as their owner)."""
        return os.geteuid()

    async def logs(self, row: TrainJob, tail: int, before: int | None = None) -> JobLog:
        """The last `tail` lines of the job's log (before byte offset `before`, to page back),
        read from the end, and its output notebook, if any. Nothing in the user's folder is
        followed (see runners/safe_files)."""
        return await asyncio.to_thread(self._read_logs, row, tail, before, self.file_owner(row.owner))

    @staticmethod
    def _read_logs(row: TrainJob, tail: int, before: int | None, uid: int) -> JobLog:
        lines: list[str] = []
        start, output = 0, False
        try:
            with folder(row.workdir, uid) as dir_fd:
                output = is_file(dir_fd, "output.ipynb")
                fd = open_file(dir_fd, "job.log", os.O_RDONLY, uid)
                try:
                    lines, start = tail_lines(fd, tail, before)
                finally:
                    os.close(fd)
        except FileNotFoundError:
            pass
        except UnsafePath as err:
            if err.errno == errno.ENOENT and not os.path.lexists(row.workdir):
                lines = [
                    "gpupool: this job's folder no longer exists (the folders of finished jobs are removed"
                    " after c.TrainPool.keep_finished_days)"
                ]
            else:
                lines = [f"gpupool: the log is not shown: {err}"]
        return {
            "lines": lines,
            "before": start,
            "output_notebook": str(Path(row.workdir, "output.ipynb")) if output else None,
        }


def make_job_folders(parent: Path) -> None:
    """The folders above the job folders, made 0711 whatever the hub's umask: each job's account
    passes through to its own folder, and no account lists the others' jobs."""
    for path in reversed([parent, *parent.parents]):
        if not path.exists():
            path.mkdir(mode=0o711, exist_ok=True)
            path.chmod(0o711)


def _parent_owner(parent: Path) -> int:
    """The folder of a user's jobs must be a real folder that only its owner may change."""
    st = parent.lstat()
    if not stat.S_ISDIR(st.st_mode) or st.st_mode & 0o022:
        raise UnsafePath(f"{parent} must be a folder that only its owner may write to")
    return st.st_uid
