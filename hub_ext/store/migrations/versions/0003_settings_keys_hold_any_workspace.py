"""A setting's key holds any user's workspace: 64 characters were too few for the per-workspace keys
("extension:<owner>/<name>", "hibernated:<owner>/<name>"; a name and a server name are up to 255
characters each). SQLite never enforced the length; PostgreSQL refused the write.

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-28
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("gpupool_settings") as batch:  # SQLite rebuilds the table
        batch.alter_column("key", existing_type=sa.String(64), type_=sa.String(600), existing_nullable=False)


def downgrade() -> None:
    with op.batch_alter_table("gpupool_settings") as batch:
        batch.alter_column("key", existing_type=sa.String(600), type_=sa.String(64), existing_nullable=False)
