"""The one interface of a training back-end, as the hub's handlers, pages and loops use it.

Two implementations, after Kueue's GenericJob (one interface per kind of workload, async):
- `LocalTraining`: the embedded back-end. gpupool's own scheduler places jobs on this machine;
  its engine (`TrainingService`, synchronous, time passed in, what the tests drive) is `local`.
- `KubeTrainingService`: each job is a batch/v1 Job; the cluster's scheduler places it; `local`
  is None.

Callers await every command and never ask which back-end they hold: what only the embedded
scheduler knows (estimates, per-pool use, the mover's pins) is read from `local` when it is set.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol, TypedDict

from gpupool.alloc.manager import PoolManager
from gpupool.pool.pools import NodePool
from gpupool.pool.training import Department, Project
from gpupool.store import TrainJob
from gpupool.train.config import TrainPool
from gpupool.train.request import JobRequest

if TYPE_CHECKING:
    from gpupool.train.service import TrainingService

Holds = Callable[[list[TrainJob]], dict[str, str]]


class JobLog(TypedDict):
    """A page of a job's log: its last lines before byte offset `before` (where the first line
    starts, to page back) and, for a notebook job run here, its executed copy."""

    lines: list[str]
    before: int
    output_notebook: str | None


class TrainingBackend(Protocol):
    pool: PoolManager
    cfg: TrainPool
    projects: dict[str, Project]
    departments: dict[str, Department]
    pools: dict[str, NodePool]

    @property
    def local(self) -> TrainingService | None:
        """The scheduler that places jobs on this machine; None where a cluster's does."""

    @property
    def holds(self) -> Holds | None:
        """Queued jobs held by a GPU-hour budget (job id -> why), from usage accounting."""

    def jobs(self, **filters: object) -> list[TrainJob]: ...

    def job(self, job_id: str) -> TrainJob | None: ...

    def queue_position(self, job_id: str) -> int | None: ...

    def wait_reason(self, row: TrainJob) -> str:
        """Why queued job `row` waits, in plain words."""

    async def start(self) -> None:
        """Take over what ran before a hub restart, and start following it."""

    async def stop(self) -> None: ...

    async def submit(self, job: JobRequest, now: float | None = None) -> TrainJob:
        """Record a new queued job (its code run as this back-end runs it)."""

    async def cancel(self, job_id: str, now: float | None = None, by: str = "") -> TrainJob: ...

    async def tick(self, now: float | None = None) -> dict[str, object]: ...

    async def logs(self, row: TrainJob, tail: int, before: int | None = None) -> JobLog: ...


class LocalTraining:
    """The embedded back-end behind the interface: blocking work (folders, files, maybe a new
    Unix account) runs off the event loop; the rest is the engine's, as before."""

    def __init__(self, engine: TrainingService) -> None:
        self.engine = engine
        self.pool, self.cfg = engine.pool, engine.cfg
        self.projects, self.departments, self.pools = engine.projects, engine.departments, engine.pools

    @property
    def local(self) -> TrainingService:
        return self.engine

    @property
    def holds(self) -> Holds | None:
        return self.engine.holds

    def jobs(self, **filters: object) -> list[TrainJob]:
        return self.engine.jobs(**filters)

    def job(self, job_id: str) -> TrainJob | None:
        return self.engine.job(job_id)

    def queue_position(self, job_id: str) -> int | None:
        return self.engine.queue_position(job_id)

    def wait_reason(self, row: TrainJob) -> str:
        return self.engine.wait_reason(row)

    async def start(self) -> None:
        self.engine.adopt_after_restart()

    async def stop(self) -> None:
        pass  # runs go on without the hub; a restarted hub adopts them

    async def submit(self, job: JobRequest, now: float | None = None) -> TrainJob:
        return await asyncio.to_thread(self.engine.submit, job, now)

    async def cancel(self, job_id: str, now: float | None = None, by: str = "") -> TrainJob:
        return self.engine.cancel(job_id, now, by)

    async def tick(self, now: float | None = None) -> dict[str, object]:
        return self.engine.tick(now)

    async def logs(self, row: TrainJob, tail: int, before: int | None = None) -> JobLog:
        return await self.engine.logs(row, tail, before)


WITHDRAWN_BY = "the hub (its sweep could not be queued whole)"


async def submit_whole(backend: TrainingBackend, jobs: list[JobRequest]) -> list[TrainJob]:
    """Queue every job of a sweep or none of them. When one fails (the jobs' disk full, a
    refused folder), the runs already queued are cancelled before the error goes on: the caller
    is told "nothing was changed", and a half sweep would hold the queue for runs its owner
    never got ids for. A cancel that itself fails is noted on the error, never hidden."""
    rows: list[TrainJob] = []
    try:
        for job in jobs:
            rows.append(await backend.submit(job))
    except BaseException as err:
        kept = []
        for row in rows:
            try:
                await backend.cancel(row.id, by=WITHDRAWN_BY)
            except Exception as cancel_err:  # noqa: BLE001 - said on the error the caller sees
                kept.append(f"run {row.name} ({row.id}) stays queued: its cancel failed: {cancel_err}")
        if withdrawn := len(rows) - len(kept):
            err.add_note(f"the {withdrawn} run(s) of the sweep queued before it were cancelled")
        for note in kept:
            err.add_note(note)
        raise
    return rows
