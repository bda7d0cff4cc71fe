"""Moves of idle workspaces (gpupool.parking.mover): the intent and phase of a move in progress, kept
after it ends for the user's status line and the hourly limit."""

from __future__ import annotations

import datetime as dt

from sqlalchemy import JSON, DateTime, Float, Integer, String, Text
from sqlalchemy.orm import Mapped, mapped_column

from gpupool.store.models import Base, utcnow
from gpupool.vocab.kinds import MovePhase


class Move(Base):
    """One move of a build workspace from its GPUs (`from_*`) to others (`to_*`). Written before
    the destination is reserved; `phase` follows the kernel (see gpupool.gpu.moving); the end is
    `moved`, `returned`, `aborted` or `lost`, with the reason."""

    __tablename__ = "gpupool_moves"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    owner: Mapped[str] = mapped_column(String(255), index=True)
    name: Mapped[str] = mapped_column(String(255))
    from_node: Mapped[str] = mapped_column(String(255))
    from_gpus: Mapped[list[int]] = mapped_column(JSON)
    from_uuids: Mapped[list[str]] = mapped_column(JSON)
    to_node: Mapped[str] = mapped_column(String(255))
    to_gpus: Mapped[list[int]] = mapped_column(JSON)
    to_uuids: Mapped[list[str]] = mapped_column(JSON)
    gpu_milli: Mapped[int] = mapped_column(Integer)
    why: Mapped[str] = mapped_column(
        String(255), default=""
    )  # "a training job", "a notebook resuming its GPU"
    phase: Mapped[str] = mapped_column(String(16), default=MovePhase.RESERVED)
    pids: Mapped[list[int]] = mapped_column(JSON, default=list)  # the processes parked (from "parked" on)
    server_pid: Mapped[int | None] = mapped_column(Integer, nullable=True)
    started_at: Mapped[float] = mapped_column(Float)
    ended_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    reason: Mapped[str] = mapped_column(Text, default="")
    created: Mapped[dt.datetime] = mapped_column(DateTime, default=utcnow)


def last_moves(session, since: float) -> dict[tuple[str, str], Move]:
    """Each workspace's last completed move that ended after `since`, by (owner, name)."""
    from sqlalchemy import select

    rows = session.scalars(
        select(Move).where(Move.phase == MovePhase.MOVED, Move.ended_at >= since).order_by(Move.id)
    )
    return {(m.owner, m.name): m for m in rows}
