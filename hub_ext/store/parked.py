"""Parked workspaces: the claim to resume survives a hub restart."""

from __future__ import annotations

import datetime as dt

from sqlalchemy import JSON, DateTime, Float, Integer, String, UniqueConstraint
from sqlalchemy.orm import Mapped, mapped_column

from gpupool.store.models import Base, utcnow


class Parked(Base):
    """A build workspace that gave its GPU share back and may ask for it again."""

    __tablename__ = "gpupool_parked"
    __table_args__ = (UniqueConstraint("owner", "name", name="one_parking_per_workspace"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    owner: Mapped[str] = mapped_column(String(255), index=True)
    name: Mapped[str] = mapped_column(String(255))
    node: Mapped[str] = mapped_column(String(255))
    gpus: Mapped[list[int]] = mapped_column(JSON)
    gpu_uuids: Mapped[list[str]] = mapped_column(JSON)  # what the processes were checkpointed on
    gpu_milli: Mapped[int] = mapped_column(Integer)
    model: Mapped[str] = mapped_column(String(255))
    groups: Mapped[list[str]] = mapped_column(JSON, default=list)
    pids: Mapped[list[int]] = mapped_column(JSON, default=list)  # checkpointed processes
    server_pid: Mapped[int | None] = mapped_column(Integer, nullable=True)
    parked_at: Mapped[float] = mapped_column(Float)
    claimed_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    created: Mapped[dt.datetime] = mapped_column(DateTime, default=utcnow)
