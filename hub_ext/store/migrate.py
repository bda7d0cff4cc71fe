"""gpupool's own tables change through alembic revisions (hub_ext/store/migrations), as
JupyterHub's do; the hub brings its database to the newest one each time it starts.

A change to a model needs a revision beside it; tests/test_store_migrations.py fails until the
revisions make the models' schema. To write one (autogenerate diffs the models against a database
at the current head)::

    python -m gpupool.store.migrate revision "add gpupool_jobs.queue"

then read and edit the file it prints (SQLite alters tables in batch mode).
"""

from __future__ import annotations

import sys
import tempfile
from functools import cache
from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Connection, Engine, create_engine

MIGRATIONS = Path(__file__).with_name("migrations")


def alembic_config(connection: Connection | None = None, url: str = "") -> Config:
    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS))
    cfg.set_main_option("version_table", "alembic_version")
    if url:
        cfg.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    cfg.attributes["connection"] = connection
    return cfg


@cache
def head() -> str:
    """The newest revision this gpupool knows."""
    newest = ScriptDirectory.from_config(alembic_config()).get_current_head()
    if newest is None:
        raise RuntimeError("gpupool's alembic revisions are missing from the installed package")
    return newest


def current(engine: Engine) -> str | None:
    """The database's revision (None: made before migrations began, or empty)."""
    with engine.connect() as conn:
        return MigrationContext.configure(conn).get_current_revision()


def upgrade(engine: Engine) -> None:
    """To the newest revision, in one transaction: a new database gets every table, one made
    before migrations began gets the baseline's missing tables and columns, rows kept."""
    with engine.begin() as conn:
        if MigrationContext.configure(conn).get_current_revision() != head():  # a restart: nothing to do
            command.upgrade(alembic_config(conn), "head")


def main(argv: list[str]) -> int:
    if len(argv) != 2 or argv[0] != "revision":
        print(__doc__)
        return 2
    with tempfile.TemporaryDirectory() as tmp:
        url = f"sqlite:///{tmp}/head.sqlite"
        upgrade(create_engine(url))
        command.revision(alembic_config(url=url), message=argv[1], autogenerate=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
