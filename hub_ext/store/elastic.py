"""Elastic train jobs: the range of sizes a job accepts. A table of its own, so that an existing
database gains it at start-up (create_all) without touching gpupool_jobs, whose num_gpu is the
job's current size."""

from __future__ import annotations

from sqlalchemy import Integer, String
from sqlalchemy.orm import Mapped, mapped_column

from gpupool.store.models import Base


class ElasticRange(Base):
    __tablename__ = "gpupool_elastic"

    job_id: Mapped[str] = mapped_column(String(32), primary_key=True)
    min_gpus: Mapped[int] = mapped_column(Integer)
    max_gpus: Mapped[int] = mapped_column(Integer)
