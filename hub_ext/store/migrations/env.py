"""alembic's entry point for gpupool's own database (gpupool.store.migrate runs it)."""

from __future__ import annotations

from alembic import context
from sqlalchemy import Connection, create_engine

import gpupool.store  # noqa: F401  every model module registers its table with Base
from gpupool.store.models import Base

config = context.config


def run(conn: Connection) -> None:
    # batch mode: SQLite alters a table by copying it, which alembic does only in batch mode
    context.configure(connection=conn, target_metadata=Base.metadata, render_as_batch=True)
    with context.begin_transaction():
        context.run_migrations()


connection = config.attributes.get("connection")
if connection is not None:
    run(connection)
else:  # `python -m gpupool.store.migrate revision ...` against a scratch database
    with create_engine(config.get_main_option("sqlalchemy.url") or "sqlite://").begin() as conn:
        run(conn)
