"""gpupool's database evolves through alembic revisions: a database made before migrations began
(by gpupool 0.1's create_all, kept as a text dump made by that code) upgrades and keeps its rows;
a new one gets the newest revision; the revisions make exactly the models' schema."""

from __future__ import annotations

import sqlite3
from datetime import datetime
from pathlib import Path

from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import JSON, DateTime, Engine, column, create_engine, inspect, select, table, text

from gpupool.host.backup import FILES, backup, restore
from gpupool.store import Move, Parked, Store, TrainJob, UsageHour
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
        # and its sweep's run (revision 0005)
        assert (jobs["j-000002"].sweep_id, jobs["j-000002"].sweep_parameters) == ("s-01", {"lr": 0.01})
        assert (jobs["j-000001"].sweep_id, jobs["j-000001"].sweep_parameters) == ("", None)
        tables = set(inspect(s.get_bind()).get_table_names())
        assert not {"gpupool_elastic", "gpupool_job_pools", "gpupool_sweep_runs"} & tables
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
        assert s.get(TrainJob, "j-000002").sweep_id == ""  # its sweep's table was missing: a job of its own


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


# gpupool_jobs and its sweep side table as revision 0004 (the last before the fold) made them
OLD_JOBS = table(
    "gpupool_jobs",
    *(column(c) for c in ("id", "owner", "project", "name", "num_gpu", "gpu_milli", "priority")),
    column("command", JSON),
    *(column(c) for c in ("workdir", "state", "submitted", "started", "finished", "min_runtime_s")),
    *(column(c) for c in ("max_runtime_s", "preemptions", "runs", "pid", "exit_code", "message")),
    *(column(c) for c in ("intent", "term_sent", "min_gpus", "max_gpus")),
    column("pools", JSON),
    column("created", DateTime),
)
OLD_SWEEP_RUNS = table(
    "gpupool_sweep_runs", column("job_id"), column("sweep_id"), column("owner"), column("parameters", JSON)
)


def old_job(job_id: str, owner: str, **fields: object) -> dict:
    row = {
        "id": job_id,
        "owner": owner,
        "project": "lab",
        "name": f"fit-{job_id}",
        "num_gpu": 1,
        "gpu_milli": 500,
        "priority": 0,
        "command": ["python", "fit.py"],
        "workdir": f"/jobs/{owner}/{job_id}",
        "state": "queued",
        "submitted": 1795000000.5,
        "started": None,
        "finished": None,
        "min_runtime_s": 0.0,
        "max_runtime_s": 0.0,
        "preemptions": 0,
        "runs": 0,
        "pid": None,
        "exit_code": None,
        "message": "",
        "intent": "",
        "term_sent": None,
        "min_gpus": 0,
        "max_gpus": 0,
        "pools": [],
        "created": datetime(2026, 11, 28, 12, 0, 0),
    }
    return row | fields


def jobs_as_stored(engine: Engine) -> dict[str, dict]:
    with engine.connect() as conn:
        return {r["id"]: dict(r) for r in conn.execute(text("SELECT * FROM gpupool_jobs")).mappings()}


def test_the_last_releases_jobs_keep_every_field_and_hold_their_sweep(store_url: str) -> None:
    """A hub at revision 0004, a sweep's runs in their side table (gpupool_sweep_runs) beside a job
    with every field set: opened by this gpupool (0005), every job keeps every field it had, each run
    holds its sweep and parameters in its own row, the side table is gone; going back to 0004 gives
    the side table its rows again."""
    engine = create_engine(store_url)
    jobs = [
        old_job(
            "a1",
            "ann",
            num_gpu=2,
            gpu_milli=1000,
            priority=3,
            command=["python", "-c", "print('é')"],
            state="running",
            started=1795000100.25,
            finished=None,
            min_runtime_s=60.0,
            max_runtime_s=3600.0,
            preemptions=2,
            runs=3,
            pid=4242,
            exit_code=None,
            message="resumed from checkpoint",
            intent="preempt",
            term_sent=1795000200.0,
            min_gpus=1,
            max_gpus=4,
            pools=["dgx", "ws"],
        ),
        old_job("b1", "bob", state="finished", exit_code=0, finished=1795000300.0),
        old_job("b2", "bob", name="fit-b2-lr0.1"),
        old_job("c1", "cat", state="failed", exit_code=1),
    ]
    sweeps = [
        {"job_id": "b1", "sweep_id": "5e1", "owner": "bob", "parameters": {"lr": 0.01, "layers": [2, 3]}},
        {"job_id": "b2", "sweep_id": "5e1", "owner": "bob", "parameters": {"lr": 0.1, "layers": [4]}},
        {"job_id": "c1", "sweep_id": "5e2", "owner": "cat", "parameters": {}},
    ]
    with engine.begin() as conn:
        command.upgrade(alembic_config(conn), "0004")
        conn.execute(OLD_JOBS.insert(), jobs)
        conn.execute(OLD_SWEEP_RUNS.insert(), sweeps)
    before = jobs_as_stored(engine)
    engine.dispose()

    store = Store(store_url)
    assert current(store.engine) == head() and schema_drift(store) == []
    after = jobs_as_stored(store.engine)
    assert after.keys() == before.keys()
    for job_id, old in before.items():
        assert {k: after[job_id][k] for k in old} == old, f"job {job_id} changed"
    with store.session() as s:
        rows = {j.id: j for j in s.scalars(select(TrainJob))}
        assert {j: (r.sweep_id, r.sweep_parameters) for j, r in rows.items()} == {
            "a1": ("", None),
            "b1": ("5e1", {"lr": 0.01, "layers": [2, 3]}),
            "b2": ("5e1", {"lr": 0.1, "layers": [4]}),
            "c1": ("5e2", {}),
        }
        assert (rows["a1"].command, rows["a1"].pools, rows["a1"].to_json()["gpus"]) == (
            ["python", "-c", "print('é')"],
            ["dgx", "ws"],
            2.0,
        )
        assert "gpupool_sweep_runs" not in inspect(s.get_bind()).get_table_names()
    store.engine.dispose()

    with create_engine(store_url).begin() as conn:  # back to the last release: its side table again
        command.downgrade(alembic_config(conn), "0004")
        assert [dict(r) for r in conn.execute(select(OLD_SWEEP_RUNS).order_by("job_id")).mappings()] == sweeps
    assert jobs_as_stored(create_engine(store_url)) == before


def test_a_backup_from_before_the_fold_is_restored_with_its_sweep(tmp_path: Path) -> None:
    """`gpupool restore` of a backup the last release made (revision 0004): the hub that starts on
    it upgrades it, and the sweep's run is there with its parameters."""
    state = tmp_path / "state"
    state.mkdir()
    url = f"sqlite:///{state / FILES[0]}"
    engine = create_engine(url)
    with engine.begin() as conn:
        command.upgrade(alembic_config(conn), "0004")
        conn.execute(OLD_JOBS.insert(), [old_job("b1", "bob")])
        conn.execute(
            OLD_SWEEP_RUNS.insert(),
            [{"job_id": "b1", "sweep_id": "5e1", "owner": "bob", "parameters": {"lr": 0.1}}],
        )
        settings = table(
            "gpupool_settings", column("key"), column("value", JSON), column("updated", DateTime)
        )
        conn.execute(
            settings.insert().values(key="instance", value={"id": "a1b2c3d4e5f6"}, updated=datetime.now())
        )
    engine.dispose()
    sqlite3.connect(state / FILES[1]).close()  # the hub's own database
    backup(state, tmp_path / "backup")
    (state / FILES[0]).unlink()  # the state lost
    Store(url).engine.dispose()  # a hub started on an empty one meanwhile
    restore(tmp_path / "backup", state)
    store = Store(url)
    assert current(store.engine) == head()
    with store.session() as s:
        run = s.get_one(TrainJob, "b1")
        assert (run.owner, run.sweep_id, run.sweep_parameters) == ("bob", "5e1", {"lr": 0.1})


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
