"""gpupool's database evolves through alembic revisions: a database made before migrations began
(by gpupool 0.1's create_all, kept as a text dump made by that code) upgrades and keeps its rows;
a new one gets the newest revision; the revisions make exactly the models' schema."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import create_engine, inspect, select, text

from gpupool.store import Move, Parked, Store, SweepRun, TrainJob, UsageHour
from gpupool.store.migrate import alembic_config, current, head
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


def test_a_new_database_gets_the_newest_revision_and_the_models_schema(store_url: str) -> None:
    store = Store(store_url)
    assert current(store.engine) == head()
    assert schema_drift(store) == [], "a model changed without a revision: see gpupool.store.migrate"
    memory = Store("sqlite:///:memory:")  # the tests' own stores
    assert current(memory.engine) == head()


def test_each_revision_moves_the_rows_of_the_one_before_on_either_database(store_url: str) -> None:
    """A hub at revision 0001 with a job's side-table rows and a setting upgrades on SQLite and on
    PostgreSQL alike: 0002 folds the rows into the job, 0003 widens the settings' key."""
    engine = create_engine(store_url)
    with engine.begin() as conn:
        command.upgrade(alembic_config(conn), "0001")
        conn.execute(
            text(
                "INSERT INTO gpupool_jobs (id, owner, project, name, num_gpu, gpu_milli, priority, command,"
                " workdir, state, submitted, min_runtime_s, max_runtime_s, preemptions, runs, message,"
                " intent, created) VALUES ('j-000001', 'ann', 'lab', 'fit', 2, 1000, 0, '[\"python\"]',"
                " '/w', 'running', 1.0, 0, 0, 0, 1, '', '', CURRENT_TIMESTAMP)"
            )
        )
        conn.execute(text("INSERT INTO gpupool_elastic VALUES ('j-000001', 1, 4)"))
        conn.execute(text("INSERT INTO gpupool_job_pools VALUES ('j-000001', '[\"dgx\"]')"))
    engine.dispose()
    store = Store(store_url)
    assert current(store.engine) == head() and schema_drift(store) == []
    with store.session() as s:
        job = s.get(TrainJob, "j-000001")
        assert (job.min_gpus, job.max_gpus, job.pools, job.command) == (1, 4, ["dgx"], ["python"])
    long_key = "extension:" + "u" * 255 + "/" + "s" * 255  # a longest user's longest server name
    store.put_setting(long_key, {"at": 1})
    assert store.get_setting(long_key) == {"at": 1}


def test_hostile_text_is_stored_the_same_on_either_database(store_url: str) -> None:
    """A NUL in a name quoted by a message (PostgreSQL's text cannot hold one) is written as U+FFFD
    on both, and the event is kept, not lost to an error."""
    store = Store(store_url)
    store.record("refuse", "no job named 'a\x00b'", owner="ann", name="a\x00b", why="a\x00b")
    [event] = store.events(owner="ann", name="a\x00b")  # looked up by what was asked
    assert (event.message, event.name, event.data) == (
        "no job named 'a\ufffdb'",
        "a\ufffdb",
        {"why": "a\x00b"},
    )
