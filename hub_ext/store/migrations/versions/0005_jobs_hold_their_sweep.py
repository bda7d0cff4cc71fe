"""A sweep's run keeps its sweep's id and its parameters in its job row.

They lived in a side table (gpupool_sweep_runs, one row per run, keyed by the job's id), made so
that `create_all` could add it to an existing database before gpupool had migrations, and written
after the runs were queued: two writes per run. As columns of gpupool_jobs a run is one row,
written once. Rows of the side table are copied into their jobs (its `owner` was the job's owner
always: both were the caller), then the table dropped.

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-29
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None

JOBS = sa.table(
    "gpupool_jobs",
    sa.column("id", sa.String),
    sa.column("owner", sa.String),
    sa.column("sweep_id", sa.String),
    sa.column("sweep_parameters", sa.JSON),
)
RUNS = sa.table(
    "gpupool_sweep_runs",
    sa.column("job_id", sa.String),
    sa.column("sweep_id", sa.String),
    sa.column("owner", sa.String),
    sa.column("parameters", sa.JSON),
)


def upgrade() -> None:
    with op.batch_alter_table("gpupool_jobs") as batch:  # SQLite rebuilds the table
        batch.add_column(sa.Column("sweep_id", sa.String(32), nullable=False, server_default=""))
        batch.add_column(sa.Column("sweep_parameters", sa.JSON(), nullable=True))
        batch.create_index("ix_gpupool_jobs_sweep_id", ["sweep_id"])
    conn = op.get_bind()
    runs = conn.execute(sa.select(RUNS.c.job_id, RUNS.c.sweep_id, RUNS.c.parameters)).all()
    for job_id, sweep_id, parameters in runs:
        conn.execute(
            sa.update(JOBS)
            .where(JOBS.c.id == job_id)
            .values(sweep_id=sweep_id, sweep_parameters=dict(parameters or {}))
        )
    op.drop_table("gpupool_sweep_runs")


def downgrade() -> None:
    op.create_table(
        "gpupool_sweep_runs",
        sa.Column("job_id", sa.String(32), primary_key=True),
        sa.Column("sweep_id", sa.String(32), nullable=False),
        sa.Column("owner", sa.String(255), nullable=False),
        sa.Column("parameters", sa.JSON(), nullable=False),
    )
    op.create_index("ix_gpupool_sweep_runs_sweep_id", "gpupool_sweep_runs", ["sweep_id"])
    conn = op.get_bind()
    runs = conn.execute(
        sa.select(JOBS.c.id, JOBS.c.sweep_id, JOBS.c.owner, JOBS.c.sweep_parameters).where(
            JOBS.c.sweep_id != ""
        )
    ).all()
    for job_id, sweep_id, owner, parameters in runs:
        conn.execute(
            RUNS.insert().values(job_id=job_id, sweep_id=sweep_id, owner=owner, parameters=parameters or {})
        )
    with op.batch_alter_table("gpupool_jobs") as batch:
        batch.drop_index("ix_gpupool_jobs_sweep_id")
        batch.drop_column("sweep_parameters")
        batch.drop_column("sweep_id")
