"""gpupool's database evolves through alembic revisions: a database made before migrations began
(by gpupool 0.1's create_all, kept as a text dump made by that code) upgrades and keeps its rows;
a new one gets the newest revision; the revisions make exactly the models' schema."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import inspect, select

from gpupool.store import Move, Parked, Store, SweepRun, TrainJob, UsageHour
from gpupool.store.migrate import current, head
from gpupool.store.models import Base

# made by gpupool 0.1 (create_all, before alembic): a Store on a new file, one row in every table
DUMP = Path(__file__).parent / "support" / "store_before_alembic.sql"


def from_dump(path: Path) -> str:
    con = sqlite3.connect(path)
    con.executescript(DUMP.read_text())
    con.close()
    return f"sqlite:///{path}"


def schema_drift(store: Store) -> list:
    with store.engine.connect() as conn:
        return compare_metadata(MigrationContext.configure(conn), Base.metadata)


def test_a_database_from_before_migrations_upgrades_and_keeps_every_row(tmp_path: Path) -> None:
    store = Store(from_dump(tmp_path / "gpupool.sqlite"))
    assert current(store.engine) == head()
    assert schema_drift(store) == []
    [ann, bob] = store.allocations()
    assert (ann.owner, ann.gpus, ann.gpu_milli, ann.groups, ann.pid) == ("ann", [0], 250, ["students"], 4242)
    assert (bob.kind, bob.name, bob.gpus) == ("train", "j-000001", [1, 2])
    assert store.get_setting("quotas") == {
        "default_build_quota": 1.0,
        "group_overrides": {"lab": {"quota": 2}},
    }
    [event] = store.events()
    assert (event.kind, event.owner, event.data) == ("reserve", "ann", {"gpus": [0]})
    with store.session() as s:
        jobs = {j.id: j for j in s.scalars(select(TrainJob))}
        assert jobs["j-000001"].command == ["python", "train.py", "--epochs", "3"]
        assert (jobs["j-000001"].state, jobs["j-000002"].state) == ("running", "queued")
        # the side tables of 0.1 folded into the job's row (revision 0002), the others' rows kept
        assert (jobs["j-000001"].min_gpus, jobs["j-000001"].max_gpus, jobs["j-000001"].pools) == (
            1,
            4,
            ["dgx", "ws"],
        )
        assert (jobs["j-000002"].min_gpus, jobs["j-000002"].pools) == (0, [])
        tables = set(inspect(s.get_bind()).get_table_names())
        assert not {"gpupool_elastic", "gpupool_job_pools"} & tables
        assert s.get(SweepRun, "j-000002").parameters == {"lr": 0.01}
        assert s.scalars(select(Parked)).one().pids == [777]
        assert s.scalars(select(Move)).one().phase == "moved"
        assert s.scalars(select(UsageHour)).one().used_milli_s == 450000
    store.record("reserve", "new rows still go in")  # and the upgraded database takes new ones
    assert len(store.events()) == 2
    Store(store.url)  # a second start finds it at head and changes nothing
    assert current(store.engine) == head() and len(store.events()) == 2


def test_an_older_database_missing_a_table_and_a_column_is_completed(tmp_path: Path) -> None:
    """What gpupool 0.1's home-made ALTER TABLE did, the baseline does: a state file older still
    (no sweeps table, no jobs.intent) gains them, with the column's default in the old rows."""
    url = from_dump(tmp_path / "gpupool.sqlite")
    con = sqlite3.connect(tmp_path / "gpupool.sqlite")
    con.executescript("DROP TABLE gpupool_sweep_runs; ALTER TABLE gpupool_jobs DROP COLUMN intent;")
    con.close()
    store = Store(url)
    assert current(store.engine) == head()
    with store.session() as s:
        assert s.get(TrainJob, "j-000001").intent == ""
        s.add(SweepRun(job_id="j-000003", sweep_id="s-02", owner="bob", parameters={}))


def test_a_new_database_gets_the_newest_revision_and_the_models_schema(tmp_path: Path) -> None:
    store = Store(f"sqlite:///{tmp_path / 'gpupool.sqlite'}")
    assert current(store.engine) == head()
    assert schema_drift(store) == [], "a model changed without a revision: see gpupool.store.migrate"
    memory = Store("sqlite:///:memory:")  # the tests' own stores
    assert current(memory.engine) == head()
