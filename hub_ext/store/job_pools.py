"""The node pools a job chose (a subset of its project's, in its own order). A table of its own,
so that an existing database gains it at start-up (create_all)."""

from __future__ import annotations

from sqlalchemy import JSON, String
from sqlalchemy.orm import Mapped, mapped_column

from gpupool.store.models import Base


class JobPools(Base):
    __tablename__ = "gpupool_job_pools"

    job_id: Mapped[str] = mapped_column(String(32), primary_key=True)
    pools: Mapped[list[str]] = mapped_column(JSON)
