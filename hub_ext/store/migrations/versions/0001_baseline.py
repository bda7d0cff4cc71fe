"""Baseline: gpupool's tables as they were when migrations began (gpupool 0.1).

Frozen here, not imported from the models, so that it means the same thing after the models move
on. It makes every table in a new database, and completes a database made before alembic (by
gpupool 0.1's create_all and ALTER TABLE): missing tables are created, missing columns added with
their default, existing rows kept.

Revision ID: 0001
Revises:
Create Date: 2026-11-26
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None

SCHEMA = sa.MetaData()

sa.Table(
    "gpupool_allocations",
    SCHEMA,
    sa.Column("id", sa.Integer(), primary_key=True),
    sa.Column("kind", sa.String(16), nullable=False),
    sa.Column("owner", sa.String(255), nullable=False, index=True),
    sa.Column("name", sa.String(255), nullable=False),
    sa.Column("node", sa.String(255), nullable=False),
    sa.Column("gpus", sa.JSON(), nullable=False),
    sa.Column("gpu_milli", sa.Integer(), nullable=False),
    sa.Column("cpu_milli", sa.Integer(), nullable=False, default=0),
    sa.Column("memory_mib", sa.Integer(), nullable=False, default=0),
    sa.Column("groups", sa.JSON(), nullable=False),
    sa.Column("state", sa.String(16), nullable=False, default="reserved"),
    sa.Column("pid", sa.Integer(), nullable=True),
    sa.Column("created", sa.DateTime(), nullable=False),
    sa.Column("updated", sa.DateTime(), nullable=False),
    sa.UniqueConstraint("kind", "owner", "name", name="one_allocation_per_workload"),
)
sa.Table(
    "gpupool_budget_grants",
    SCHEMA,
    sa.Column("id", sa.Integer(), primary_key=True),
    sa.Column("target", sa.String(300), nullable=False, index=True),
    sa.Column("kind", sa.String(16), nullable=False),
    sa.Column("milli_s", sa.BigInteger(), nullable=False, default=0),
    sa.Column("until", sa.Integer(), nullable=False),
    sa.Column("by", sa.String(255), nullable=False, default=""),
    sa.Column("note", sa.Text(), nullable=False, default=""),
    sa.Column("created", sa.DateTime(), nullable=False),
)
sa.Table(
    "gpupool_elastic",
    SCHEMA,
    sa.Column("job_id", sa.String(32), primary_key=True),
    sa.Column("min_gpus", sa.Integer(), nullable=False),
    sa.Column("max_gpus", sa.Integer(), nullable=False),
)
sa.Table(
    "gpupool_events",
    SCHEMA,
    sa.Column("id", sa.Integer(), primary_key=True),
    sa.Column("time", sa.DateTime(), nullable=False, index=True),
    sa.Column("kind", sa.String(32), nullable=False, index=True),
    sa.Column("owner", sa.String(255), nullable=False, index=True, default=""),
    sa.Column("name", sa.String(255), nullable=False, default=""),
    sa.Column("message", sa.Text(), nullable=False, default=""),
    sa.Column("data", sa.JSON(), nullable=False),
)
sa.Table(
    "gpupool_job_pools",
    SCHEMA,
    sa.Column("job_id", sa.String(32), primary_key=True),
    sa.Column("pools", sa.JSON(), nullable=False),
)
sa.Table(
    "gpupool_jobs",
    SCHEMA,
    sa.Column("id", sa.String(32), primary_key=True),
    sa.Column("owner", sa.String(255), nullable=False, index=True),
    sa.Column("project", sa.String(255), nullable=False),
    sa.Column("name", sa.String(64), nullable=False),
    sa.Column("num_gpu", sa.Integer(), nullable=False),
    sa.Column("gpu_milli", sa.Integer(), nullable=False),
    sa.Column("priority", sa.Integer(), nullable=False, default=0),
    sa.Column("command", sa.JSON(), nullable=False),
    sa.Column("workdir", sa.Text(), nullable=False),
    sa.Column("state", sa.String(16), nullable=False, index=True, default="queued"),
    sa.Column("submitted", sa.Float(), nullable=False),
    sa.Column("started", sa.Float(), nullable=True),
    sa.Column("finished", sa.Float(), nullable=True),
    sa.Column("min_runtime_s", sa.Float(), nullable=False, default=0.0),
    sa.Column("max_runtime_s", sa.Float(), nullable=False, default=0.0),
    sa.Column("preemptions", sa.Integer(), nullable=False, default=0),
    sa.Column("runs", sa.Integer(), nullable=False, default=0),
    sa.Column("pid", sa.Integer(), nullable=True),
    sa.Column("exit_code", sa.Integer(), nullable=True),
    sa.Column("message", sa.Text(), nullable=False, default=""),
    sa.Column("intent", sa.String(16), nullable=False, default=""),
    sa.Column("term_sent", sa.Float(), nullable=True),
    sa.Column("created", sa.DateTime(), nullable=False),
)
sa.Table(
    "gpupool_moves",
    SCHEMA,
    sa.Column("id", sa.Integer(), primary_key=True),
    sa.Column("owner", sa.String(255), nullable=False, index=True),
    sa.Column("name", sa.String(255), nullable=False),
    sa.Column("from_node", sa.String(255), nullable=False),
    sa.Column("from_gpus", sa.JSON(), nullable=False),
    sa.Column("from_uuids", sa.JSON(), nullable=False),
    sa.Column("to_node", sa.String(255), nullable=False),
    sa.Column("to_gpus", sa.JSON(), nullable=False),
    sa.Column("to_uuids", sa.JSON(), nullable=False),
    sa.Column("gpu_milli", sa.Integer(), nullable=False),
    sa.Column("why", sa.String(255), nullable=False, default=""),
    sa.Column("phase", sa.String(16), nullable=False, default="reserved"),
    sa.Column("pids", sa.JSON(), nullable=False),
    sa.Column("server_pid", sa.Integer(), nullable=True),
    sa.Column("started_at", sa.Float(), nullable=False),
    sa.Column("ended_at", sa.Float(), nullable=True),
    sa.Column("reason", sa.Text(), nullable=False, default=""),
    sa.Column("created", sa.DateTime(), nullable=False),
)
sa.Table(
    "gpupool_parked",
    SCHEMA,
    sa.Column("id", sa.Integer(), primary_key=True),
    sa.Column("owner", sa.String(255), nullable=False, index=True),
    sa.Column("name", sa.String(255), nullable=False),
    sa.Column("node", sa.String(255), nullable=False),
    sa.Column("gpus", sa.JSON(), nullable=False),
    sa.Column("gpu_uuids", sa.JSON(), nullable=False),
    sa.Column("gpu_milli", sa.Integer(), nullable=False),
    sa.Column("model", sa.String(255), nullable=False),
    sa.Column("groups", sa.JSON(), nullable=False),
    sa.Column("pids", sa.JSON(), nullable=False),
    sa.Column("server_pid", sa.Integer(), nullable=True),
    sa.Column("parked_at", sa.Float(), nullable=False),
    sa.Column("claimed_at", sa.Float(), nullable=True),
    sa.Column("created", sa.DateTime(), nullable=False),
    sa.UniqueConstraint("owner", "name", name="one_parking_per_workspace"),
)
sa.Table(
    "gpupool_settings",
    SCHEMA,
    sa.Column("key", sa.String(64), primary_key=True),
    sa.Column("value", sa.JSON(), nullable=False),
    sa.Column("updated", sa.DateTime(), nullable=False),
)
sa.Table(
    "gpupool_sweep_runs",
    SCHEMA,
    sa.Column("job_id", sa.String(32), primary_key=True),
    sa.Column("sweep_id", sa.String(32), nullable=False, index=True),
    sa.Column("owner", sa.String(255), nullable=False),
    sa.Column("parameters", sa.JSON(), nullable=False),
)
sa.Table(
    "gpupool_usage_hours",
    SCHEMA,
    sa.Column("hour", sa.Integer(), primary_key=True),
    sa.Column("kind", sa.String(16), primary_key=True),
    sa.Column("owner", sa.String(255), primary_key=True),
    sa.Column("name", sa.String(255), primary_key=True),
    sa.Column("since", sa.Integer(), primary_key=True),
    sa.Column("milli", sa.Integer(), nullable=False, default=0),
    sa.Column("measured_milli_s", sa.BigInteger(), nullable=False, default=0),
    sa.Column("used_milli_s", sa.BigInteger(), nullable=False, default=0),
    sa.Column("peak_memory_mib", sa.Integer(), nullable=False, default=0),
    sa.Column("share_memory_mib", sa.Integer(), nullable=False, default=0),
    sa.Column("samples", sa.Integer(), nullable=False, default=0),
)


def upgrade() -> None:
    bind = op.get_bind()
    have = sa.inspect(bind)
    for table in SCHEMA.sorted_tables:
        if not have.has_table(table.name):
            table.create(bind)  # with its indexes
            continue
        present = {c["name"] for c in have.get_columns(table.name)}
        for col in table.columns:
            if col.name in present:
                continue
            # as gpupool 0.1 did: nullable, the default for the rows already there
            default = col.default.arg if isinstance(col.default, sa.ColumnDefault) else None
            server_default = None if default is None else sa.text(repr(default))
            op.add_column(
                table.name, sa.Column(col.name, col.type, nullable=True, server_default=server_default)
            )
        indexes = {i["name"] for i in have.get_indexes(table.name)}
        for index in table.indexes:
            if index.name not in indexes:
                index.create(bind)


def downgrade() -> None:
    raise RuntimeError("0001 is gpupool's first revision: there is nothing to go back to (restore a backup)")
