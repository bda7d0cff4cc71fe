"""Train jobs and their history."""

from __future__ import annotations

import datetime as dt

from sqlalchemy import JSON, DateTime, Float, Integer, String, Text
from sqlalchemy.orm import Mapped, mapped_column

from gpupool.store.models import Base, utcnow
from gpupool.vocab.job_wire import JobRecord
from gpupool.vocab.states import JobState

STATES = tuple(JobState)  # the values stored in TrainJob.state


class TrainJob(Base):
    __tablename__ = "gpupool_jobs"

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    owner: Mapped[str] = mapped_column(String(255), index=True)
    project: Mapped[str] = mapped_column(String(255))
    name: Mapped[str] = mapped_column(String(64))
    num_gpu: Mapped[int] = mapped_column(Integer)
    gpu_milli: Mapped[int] = mapped_column(Integer)
    priority: Mapped[int] = mapped_column(Integer, default=0)
    command: Mapped[list[str]] = mapped_column(JSON)
    workdir: Mapped[str] = mapped_column(Text)
    state: Mapped[str] = mapped_column(String(16), default=JobState.QUEUED, index=True)
    submitted: Mapped[float] = mapped_column(Float)  # epoch seconds; kept across preemptions
    started: Mapped[float | None] = mapped_column(Float, nullable=True)  # current run
    finished: Mapped[float | None] = mapped_column(Float, nullable=True)
    min_runtime_s: Mapped[float] = mapped_column(Float, default=0.0)
    max_runtime_s: Mapped[float] = mapped_column(Float, default=0.0)  # 0: none
    preemptions: Mapped[int] = mapped_column(Integer, default=0)
    runs: Mapped[int] = mapped_column(Integer, default=0)
    pid: Mapped[int | None] = mapped_column(Integer, nullable=True)
    exit_code: Mapped[int | None] = mapped_column(Integer, nullable=True)
    message: Mapped[str] = mapped_column(Text, default="")
    # what the hub has decided to do to the current run, written before it acts, so that a
    # restarted hub carries it out: a gpupool.vocab.states.Intent ("": a preemption, requeue)
    intent: Mapped[str] = mapped_column(String(16), default="")
    term_sent: Mapped[float | None] = mapped_column(
        Float, nullable=True
    )  # first SIGTERM: kill deadline - grace
    # an elastic job runs on min_gpus..max_gpus whole GPUs (0: not elastic; num_gpu is its size now)
    min_gpus: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    max_gpus: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    # the node pools it chose (a subset of its project's, in its order; on KAI its one shard)
    pools: Mapped[list[str]] = mapped_column(JSON, default=list)
    # the sweep it is a run of ("": none) and the parameters that run got (None: not a sweep's)
    sweep_id: Mapped[str] = mapped_column(String(32), default="", server_default="", index=True)
    sweep_parameters: Mapped[dict[str, object] | None] = mapped_column(JSON, nullable=True)
    created: Mapped[dt.datetime] = mapped_column(DateTime, default=utcnow)

    @property
    def total_milli(self) -> int:
        return self.num_gpu * self.gpu_milli

    def to_json(self) -> JobRecord:
        return {
            "id": self.id,
            "owner": self.owner,
            "project": self.project,
            "name": self.name,
            "gpus": self.total_milli / 1000,
            "num_gpu": self.num_gpu,
            "gpu_milli": self.gpu_milli,
            "priority": self.priority,
            "command": self.command,
            "state": self.state,
            "submitted": self.submitted,
            "started": self.started,
            "finished": self.finished,
            "preemptions": self.preemptions,
            "runs": self.runs,
            "exit_code": self.exit_code,
            "message": self.message,
            "workdir": self.workdir,
            "min_runtime_s": self.min_runtime_s,
            "max_runtime_s": self.max_runtime_s,
        }
