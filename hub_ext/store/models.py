"""Tables. One row per held share; the unique key makes a doubled allocation impossible."""

from __future__ import annotations

import datetime as dt
from typing import Any

from sqlalchemy import JSON, DateTime, Integer, String, Text, UniqueConstraint
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from gpupool.vocab.kinds import AllocationState


def utcnow() -> dt.datetime:
    return dt.datetime.now(dt.UTC).replace(tzinfo=None)


class Base(DeclarativeBase):
    pass


class Allocation(Base):
    """A GPU share held by a workload: a build workspace or a train job."""

    __tablename__ = "gpupool_allocations"
    __table_args__ = (UniqueConstraint("kind", "owner", "name", name="one_allocation_per_workload"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    kind: Mapped[str] = mapped_column(String(16))  # gpupool.vocab.kinds.WorkloadKind
    owner: Mapped[str] = mapped_column(String(255), index=True)
    name: Mapped[str] = mapped_column(String(255))  # server name ('' = default) or job id
    node: Mapped[str] = mapped_column(String(255))
    gpus: Mapped[list[int]] = mapped_column(JSON)
    gpu_milli: Mapped[int] = mapped_column(Integer)
    cpu_milli: Mapped[int] = mapped_column(Integer, default=0)
    memory_mib: Mapped[int] = mapped_column(Integer, default=0)
    groups: Mapped[list[str]] = mapped_column(JSON, default=list)  # owner's groups at reserve time
    state: Mapped[str] = mapped_column(String(16), default=AllocationState.RESERVED)
    pid: Mapped[int | None] = mapped_column(Integer, nullable=True)
    created: Mapped[dt.datetime] = mapped_column(DateTime, default=utcnow)
    updated: Mapped[dt.datetime] = mapped_column(DateTime, default=utcnow, onupdate=utcnow)

    @property
    def total_milli(self) -> int:
        return len(self.gpus) * self.gpu_milli


class Event(Base):
    """Something an admin may want to read later: allocations, refusals, culls, preemptions."""

    __tablename__ = "gpupool_events"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    time: Mapped[dt.datetime] = mapped_column(DateTime, default=utcnow, index=True)
    kind: Mapped[str] = mapped_column(
        String(32), index=True
    )  # gpupool.vocab.kinds.EventKind or train.states.JobEvent
    owner: Mapped[str] = mapped_column(String(255), default="", index=True)
    name: Mapped[str] = mapped_column(String(255), default="")
    message: Mapped[str] = mapped_column(Text, default="")
    data: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict[str, Any])


class Setting(Base):
    """Admin changes made through the API (quotas), kept across restarts."""

    __tablename__ = "gpupool_settings"

    # "extension:<owner>/<name>": a user name and a server name of up to 255 characters each
    key: Mapped[str] = mapped_column(String(600), primary_key=True)
    value: Mapped[dict[str, object]] = mapped_column(JSON)
    updated: Mapped[dt.datetime] = mapped_column(DateTime, default=utcnow, onupdate=utcnow)
