"""A train job's elastic range and chosen node pools move into its row.

They lived in two side tables (gpupool_elastic, gpupool_job_pools), made so that `create_all` could
add them to an existing database before gpupool had migrations; with migrations they are columns
of gpupool_jobs, and a new job is one row. Rows of the side tables are copied into their jobs, then
the tables dropped.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-28
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("gpupool_jobs") as batch:  # SQLite rebuilds the table
        batch.add_column(sa.Column("min_gpus", sa.Integer(), nullable=False, server_default="0"))
        batch.add_column(sa.Column("max_gpus", sa.Integer(), nullable=False, server_default="0"))
        batch.add_column(sa.Column("pools", sa.JSON(), nullable=False, server_default=sa.text("'[]'")))
    jobs = sa.table(
        "gpupool_jobs",
        sa.column("id", sa.String),
        sa.column("min_gpus", sa.Integer),
        sa.column("max_gpus", sa.Integer),
        sa.column("pools", sa.JSON),
    )
    elastic = sa.table(
        "gpupool_elastic",
        sa.column("job_id", sa.String),
        sa.column("min_gpus", sa.Integer),
        sa.column("max_gpus", sa.Integer),
    )
    chosen = sa.table("gpupool_job_pools", sa.column("job_id", sa.String), sa.column("pools", sa.JSON))
    conn = op.get_bind()
    for job_id, least, most in conn.execute(
        sa.select(elastic.c.job_id, elastic.c.min_gpus, elastic.c.max_gpus)
    ):
        conn.execute(sa.update(jobs).where(jobs.c.id == job_id).values(min_gpus=least, max_gpus=most))
    for job_id, pools in conn.execute(sa.select(chosen.c.job_id, chosen.c.pools)):
        conn.execute(sa.update(jobs).where(jobs.c.id == job_id).values(pools=list(pools or [])))
    op.drop_table("gpupool_elastic")
    op.drop_table("gpupool_job_pools")


def downgrade() -> None:
    op.create_table(
        "gpupool_elastic",
        sa.Column("job_id", sa.String(32), primary_key=True),
        sa.Column("min_gpus", sa.Integer(), nullable=False),
        sa.Column("max_gpus", sa.Integer(), nullable=False),
    )
    op.create_table(
        "gpupool_job_pools",
        sa.Column("job_id", sa.String(32), primary_key=True),
        sa.Column("pools", sa.JSON(), nullable=False),
    )
    conn = op.get_bind()
    jobs = sa.table(
        "gpupool_jobs",
        sa.column("id", sa.String),
        sa.column("min_gpus", sa.Integer),
        sa.column("max_gpus", sa.Integer),
        sa.column("pools", sa.JSON),
    )
    for job_id, least, most, pools in conn.execute(
        sa.select(jobs.c.id, jobs.c.min_gpus, jobs.c.max_gpus, jobs.c.pools)
    ):
        if least:
            conn.execute(
                sa.table("gpupool_elastic", sa.column("job_id"), sa.column("min_gpus"), sa.column("max_gpus"))
                .insert()
                .values(job_id=job_id, min_gpus=least, max_gpus=most)
            )
        if pools:
            conn.execute(
                sa.table("gpupool_job_pools", sa.column("job_id"), sa.column("pools", sa.JSON))
                .insert()
                .values(job_id=job_id, pools=pools)
            )
    with op.batch_alter_table("gpupool_jobs") as batch:
        batch.drop_column("pools")
        batch.drop_column("max_gpus")
        batch.drop_column("min_gpus")
