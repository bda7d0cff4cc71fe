"""Train pods' GPU intervals on Kubernetes (gpupool_pod_spans): a train job placed by the cluster's
scheduler holds no hub allocation, so its GPU-hours are read from its pods' lifetimes and kept
here, one row per pod (gpupool.kube.pod_usage). A new table; no existing one changes.

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-29
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "gpupool_pod_spans",
        sa.Column("uid", sa.String(64), primary_key=True),
        sa.Column("job", sa.String(64), nullable=False),
        sa.Column("owner", sa.String(255), nullable=False),
        sa.Column("milli", sa.Integer(), nullable=False),
        sa.Column("start", sa.Integer(), nullable=False),
        sa.Column("end", sa.Integer(), nullable=True),
        sa.Column("node", sa.String(255), nullable=False),
        sa.Column("exact", sa.Boolean(), nullable=False),
        sa.Column("seen", sa.Integer(), nullable=False),
    )
    op.create_index("ix_gpupool_pod_spans_job", "gpupool_pod_spans", ["job"])
    op.create_index("ix_gpupool_pod_spans_owner", "gpupool_pod_spans", ["owner"])
    op.create_index("ix_gpupool_pod_spans_end", "gpupool_pod_spans", ["end"])


def downgrade() -> None:
    op.drop_table("gpupool_pod_spans")
