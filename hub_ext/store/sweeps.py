"""Which jobs a sweep submitted, with the parameters each run got. A table of its own, so that
an existing database gains it at start-up (create_all) without touching gpupool_jobs."""

from __future__ import annotations

from sqlalchemy import JSON, String
from sqlalchemy.orm import Mapped, mapped_column

from gpupool.store.models import Base


class SweepRun(Base):
    __tablename__ = "gpupool_sweep_runs"

    job_id: Mapped[str] = mapped_column(String(32), primary_key=True)
    sweep_id: Mapped[str] = mapped_column(String(32), index=True)
    owner: Mapped[str] = mapped_column(String(255))
    parameters: Mapped[dict] = mapped_column(JSON)
