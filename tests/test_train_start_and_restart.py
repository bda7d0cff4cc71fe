"""Real job processes: a start that fails ends the job `failed` with the reason and frees its
GPUs at once (the queue goes on); cancel, max runtime and the SIGKILL deadline are written
before they are acted on and carried out by a restarted hub (a new service on the same
database, as after kill -9). Jobs wait for a file the test writes, never for the clock."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest

from gpupool.pool import BuildLimits
from gpupool.train.service import TrainingService
from tests.support.jobs import job_request
from tests.support.pools import make_training, run_until
from tests.support.wait import until

DONE = ("succeeded", "failed", "cancelled")
# waits for the test's signal file; with stubborn=True it also ignores SIGTERM
WAITER = """
import os, signal, sys, time
if {stubborn}:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
open("started", "w").close()
while not os.path.exists("go"):
    time.sleep(0.02)
print("finished")
"""


@pytest.fixture(autouse=True)
def no_job_left_behind(tmp_path: Path):
    """A failing test must not leave its waiting jobs running: SIGKILL what is left of ours."""
    yield
    import os
    import signal

    for proc in Path("/proc").iterdir():
        try:
            if proc.name.isdigit() and str(tmp_path).encode() in (proc / "cmdline").read_bytes():
                os.killpg(int(proc.name), signal.SIGKILL)
        except (OSError, ProcessLookupError):
            pass


def service(tmp_path: Path, grace: float = 30.0, **train) -> TrainingService:
    return make_training(
        tmp_path,
        1,
        limits=BuildLimits(1000, (1000,), 1000, 2),
        projects={"a": {"guarantee": 1}},
        grace_s=grace,
        **train,
    )


def restart(tmp_path: Path, **kw) -> TrainingService:
    """What a hub restart does: a fresh manager and service on the same database."""
    svc = service(tmp_path, **kw)
    svc.adopt_after_restart()
    return svc


def wait_file(path: Path, timeout: float = 30) -> None:
    until(path.exists, f"{path} to appear", timeout=timeout, every=0.02)


def waiter(svc: TrainingService, stubborn: bool = False, max_runtime_s: float = 0.0):
    return svc.submit(
        job_request(
            owner="ann",
            project="a",
            name="wait",
            command=[sys.executable, "job.py"],
            files={"job.py": WAITER.format(stubborn=stubborn).encode()},
            max_runtime_s=max_runtime_s,
        )
    )


def started(svc: TrainingService, job_id: str) -> Path:
    run_until(svc, lambda: svc.job(job_id).state == "running")
    folder = Path(svc.job(job_id).workdir)
    wait_file(folder / "started")
    return folder


# --- start failures ----------------------------------------------------------------------
def test_a_command_that_does_not_exist_fails_with_the_errno_message_and_the_queue_goes_on(
    tmp_path: Path,
) -> None:
    svc = service(tmp_path)
    bad = svc.submit(
        job_request(owner="ann", project="a", name="bad", command=["no-such-command-xyz", "--flag"])
    )
    good = svc.submit(
        job_request(owner="ann", project="a", name="good", command=[sys.executable, "-c", "print('hello')"])
    )
    run_until(svc, lambda: svc.job(good.id).state in DONE)
    row = svc.job(bad.id)
    assert row.state == "failed"
    assert row.message == "could not start 'no-such-command-xyz': No such file or directory"
    assert row.exit_code == 127
    assert svc.job(good.id).state == "succeeded"
    assert svc.pool.store.allocations() == []


@pytest.mark.parametrize("breakage", ["checkpoint-is-a-file", "checkpoint-is-a-link", "missing-interpreter"])
def test_a_job_that_cannot_start_ends_failed_and_frees_its_gpus_in_the_same_cycle(
    tmp_path: Path, breakage: str
) -> None:
    train = {"python": "/no/such/python3"} if breakage == "missing-interpreter" else {}
    svc = service(tmp_path, **train)
    job = svc.submit(
        job_request(owner="ann", project="a", name="broken", command=[sys.executable, "-c", "pass"])
    )
    folder = Path(job.workdir)
    if breakage == "checkpoint-is-a-file":
        (folder / "checkpoint").write_text("not a folder")
    elif breakage == "checkpoint-is-a-link":
        (tmp_path / "elsewhere").mkdir()
        (folder / "checkpoint").symlink_to(tmp_path / "elsewhere")
    svc.tick(time.time())  # one cycle: no exception, the job has failed, nothing is held
    row = svc.job(job.id)
    assert row.state == "failed", row.to_json()
    expected = {
        "checkpoint-is-a-file": "checkpoint is not a folder",
        "checkpoint-is-a-link": "checkpoint is not a folder",
        "missing-interpreter": "No such file or directory",
    }[breakage]
    assert row.message.startswith("could not start") and expected in row.message
    assert svc.pool.store.allocations() == []
    assert svc.pool.state.copy().gpu_free.sum() == 1000  # in memory too
    kinds = [e.kind for e in svc.pool.store.events(name=job.id)]
    assert kinds[:2] == ["fail", "release"] or set(kinds[:2]) == {"fail", "release"}
    # the queue is not wedged: the next job starts and runs
    if breakage != "missing-interpreter":
        nxt = svc.submit(
            job_request(owner="ann", project="a", name="next", command=[sys.executable, "-c", "pass"])
        )
        run_until(svc, lambda: svc.job(nxt.id).state in DONE)
        assert svc.job(nxt.id).state == "succeeded"


# --- persisted intent ------------------------------------------------------------------
def test_a_job_cancelled_just_before_a_restart_is_never_resurrected(tmp_path: Path, store_url: str) -> None:
    svc = service(tmp_path, db=store_url)
    job = waiter(svc).id
    started(svc, job)
    svc.cancel(job)  # SIGTERM sent; the hub dies before it sees the run end
    again = restart(tmp_path, db=store_url)
    run_until(again, lambda: again.job(job).state in DONE)
    row = again.job(job)
    assert (row.state, row.runs) == ("cancelled", 1)
    for _ in range(5):
        again.tick(time.time())
    assert again.job(job).runs == 1 and again.pool.store.allocations() == []


def test_the_kill_deadline_of_a_job_that_ignores_sigterm_survives_a_restart(tmp_path: Path) -> None:
    svc = service(tmp_path, grace=30)
    job = waiter(svc, stubborn=True).id
    started(svc, job)
    t0 = time.time()
    svc.cancel(job, now=t0)
    again = restart(tmp_path, grace=30)
    for _ in range(3):
        again.tick(t0 + 5)  # within the grace period: still there, still holding its GPU
    assert again.job(job).state == "preempting" and len(again.pool.store.allocations()) == 1
    run_until(again, lambda: again.job(job).state in DONE, now=lambda: t0 + 31)  # past it: SIGKILL
    row = again.job(job)
    assert (row.state, row.exit_code) == ("cancelled", -9)
    assert again.pool.store.allocations() == []


def test_max_runtime_reached_before_a_restart_ends_the_job_for_good(tmp_path: Path) -> None:
    svc = service(tmp_path)
    job = waiter(svc, max_runtime_s=60).id
    started(svc, job)
    t_run = svc.job(job).started
    svc.tick(t_run + 61)  # travel past the max runtime: SIGTERM, intent written
    assert svc.job(job).state == "preempting"
    again = restart(tmp_path)
    run_until(again, lambda: again.job(job).state in DONE, now=lambda: t_run + 62)
    row = again.job(job)
    assert (row.state, row.message, row.runs) == ("failed", "stopped at its max runtime", 1)


def test_a_run_started_just_before_a_crash_is_adopted_not_started_twice(tmp_path: Path) -> None:
    svc = service(tmp_path)
    job = waiter(svc).id
    folder = started(svc, job)
    # the crash came after the process started and before its pid was written
    svc._set(job, pid=None)
    again = restart(tmp_path)
    assert again.job(job).pid is not None
    for _ in range(3):
        again.tick(time.time())
    (folder / "go").touch()
    run_until(again, lambda: again.job(job).state in DONE)
    row = again.job(job)
    assert (row.state, row.runs) == ("succeeded", 1)
    assert Path(row.workdir, "job.log").read_text().count("finished") == 1


def test_gpus_held_for_a_job_that_never_started_go_back_after_a_restart(tmp_path: Path) -> None:
    from gpupool.alloc.manager import Workload
    from gpupool.pool.request import Placement

    svc = service(tmp_path)
    job = waiter(svc).id
    svc.pool.reserve_at(Workload("train", "ann", job), Placement("localhost", (0,), 1000))  # then the crash
    again = restart(tmp_path)
    assert again.pool.store.allocations() == []
    folder = started(again, job)  # and it starts normally, no IntegrityError
    (folder / "go").touch()
    run_until(again, lambda: again.job(job).state in DONE)
    assert again.job(job).state == "succeeded"


def test_logs_are_read_from_the_end_in_bounded_pages(tmp_path: Path) -> None:
    import asyncio

    svc = service(tmp_path)
    job = svc.submit(
        job_request(owner="ann", project="a", name="big", command=[sys.executable, "-c", "pass"])
    )
    with open(Path(job.workdir, "job.log"), "wb") as f:
        f.write(
            b"x" * (8 << 20) + b"\n"
        )  # an 8 MiB line (a progress bar without newlines), then numbered lines
        f.write(b"".join(f"line {i}\n".encode() for i in range(1000)))
    last = asyncio.run(svc.logs(svc.job(job.id), 3))
    assert last["lines"] == ["line 997", "line 998", "line 999"]
    page = asyncio.run(svc.logs(svc.job(job.id), 2, before=last["before"]))
    assert page["lines"] == ["line 995", "line 996"]
    rest = asyncio.run(svc.logs(svc.job(job.id), 10_000, before=page["before"]))
    assert rest["lines"][-995:] == [f"line {i}" for i in range(995)]
    assert len("".join(rest["lines"])) <= 1 << 20  # a page is at most 1 MiB, whatever the file holds
    assert rest["before"] > 0  # more to read further back, page by page


def test_jobs_get_a_clean_environment_and_the_state_database_is_private(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("JUPYTERHUB_API_TOKEN", "hub-secret-token")
    monkeypatch.setenv("GPUPOOL_DEMO_PASSWORD", "demo-password")
    monkeypatch.setenv("CONFIGPROXY_AUTH_TOKEN", "proxy-secret")
    svc = service(tmp_path)
    job = svc.submit(
        job_request(
            owner="ann",
            project="a",
            name="env",
            command=[sys.executable, "-c", "import os; print(sorted(os.environ.items()))"],
        )
    )
    run_until(svc, lambda: svc.job(job.id).state in DONE)
    log = Path(job.workdir, "job.log").read_text()
    assert svc.job(job.id).state == "succeeded" and "GPUPOOL_CHECKPOINT_DIR" in log
    for secret in ("hub-secret-token", "demo-password", "proxy-secret"):
        assert secret not in log
    assert (tmp_path / "pool.sqlite").stat().st_mode & 0o777 == 0o600


def test_a_run_recorded_but_never_started_before_a_crash_goes_back_to_the_queue(
    tmp_path: Path, store_url: str
) -> None:
    from gpupool.alloc.manager import Workload
    from gpupool.pool.request import Placement

    svc = service(tmp_path, db=store_url)
    job = waiter(svc).id
    # the crash came after the run was recorded and its GPUs reserved, before the process started
    svc.pool.reserve_at(Workload("train", "ann", job), Placement("localhost", (0,), 1000))
    svc._set(job, state="running", pid=None, runs=1, started=time.time())
    again = restart(tmp_path, db=store_url)
    run_until(again, lambda: again.job(job).pid is not None)  # requeued and started, not failed
    folder = Path(again.job(job).workdir)
    wait_file(folder / "started")
    (folder / "go").touch()
    run_until(again, lambda: again.job(job).state in DONE)
    assert again.job(job).state == "succeeded"
    assert len((folder / "job.log").read_text().split("finished")) == 2


def test_cancelling_a_queued_job_frees_gpus_a_crash_left_reserved_for_it(tmp_path: Path) -> None:
    from gpupool.alloc.manager import Workload
    from gpupool.pool.request import Placement

    svc = service(tmp_path)
    job = waiter(svc).id
    svc.pool.reserve_at(Workload("train", "ann", job), Placement("localhost", (0,), 1000))
    svc.cancel(job)
    assert svc.job(job).state == "cancelled" and svc.pool.store.allocations() == []
    assert svc.pool.state.copy().gpu_free.sum() == 1000
