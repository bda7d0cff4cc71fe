"""Stop means stop: from the first SIGTERM the hub starts nothing new (the GPUs a stopped server
gives back during the shutdown once went to a queued job, which then ran on with no hub counting
it), and the log says what keeps running. A real hub stopped as `make up`'s Ctrl-C stops it."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from tests.hubtools import Hub

pytestmark = pytest.mark.hub
J = "/services/gpupool/api/jobs"
CONFIG = """
c.TrainPool.tick_s = 0.2
c.TrainPool.projects = {"lab": {"guarantee": 1}}
"""
WAITER = """
import os, time
with open("job.pid", "w") as f:
    f.write(str(os.getpid()))
while not os.path.exists("go"):
    time.sleep(0.05)
"""


def _stop_jobs(hub: Hub, config: bool = True) -> subprocess.CompletedProcess:
    """`gpupool stop-jobs` as an admin runs it, with the hub's state and (or not) its config."""
    return subprocess.run(
        [sys.executable, "-m", "gpupool.wiring.cli", "stop-jobs", "--state", str(hub.state)]
        + (["--config", str(hub.state / "test_config.py")] if config else []),
        capture_output=True,
        text=True,
        timeout=120,
    )


def _runs(pid: int) -> bool:
    """Alive, as a process that is not a zombie waiting for a reaper."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_a_stopping_hub_starts_no_queued_job_and_stop_jobs_ends_what_keeps_running(make_hub) -> None:
    """The stop says what keeps running and names `gpupool stop-jobs`, which is refused while the
    hub runs, then ends the job it left (its process gone, the job back in the queue, its GPU
    released), and has nothing to stop the second time."""
    hub: Hub = make_hub(CONFIG, env={"GPUPOOL_CULLER": "0"}).start()
    token = hub.user_token("ann")
    hub.spawn("ann", 0.5)  # its GPU comes back when the stop ends the server
    running = hub.api("POST", J, {"project": "lab", "gpus": 1, "name": "runs", "script": WAITER}, token=token)
    running = hub.wait_job(running["id"], {"running"}, token)
    queued = hub.api("POST", J, {"project": "lab", "gpus": 3, "name": "waits", "script": WAITER}, token=token)
    assert hub.api("GET", f"{J}/{queued['id']}", token=token)["state"] == "queued"
    refused = _stop_jobs(hub)
    assert refused.returncode == 1 and "a hub runs on" in refused.stderr, refused
    assert hub.api("GET", f"{J}/{running['id']}", token=token)["state"] == "running"
    before = hub.log_path.stat().st_size
    assert hub.proc is not None
    hub.proc.send_signal(signal.SIGTERM)  # as Ctrl-C on `make up`; what it leaves runs on
    hub.proc.wait(60)
    log = hub.log_path.read_bytes()[before:].decode(errors="replace")
    db = hub.state / "gpupool.sqlite"

    def job(job_id: str) -> tuple:
        con = sqlite3.connect(db)
        try:
            return con.execute(
                "SELECT state, pid, workdir FROM gpupool_jobs WHERE id = ?", (job_id,)
            ).fetchone()
        finally:
            con.close()

    assert job(queued["id"])[0] == "queued", log  # not started by the stopping hub
    assert "allocated" not in log.split("no server or train job starts from now", 1)[-1], log
    assert "no server or train job starts from now" in log, log
    assert "1 train job(s) keep running as" in log and running["id"] in log, log
    assert "adopted at the next start" in log and "--stop-jobs" in log, log
    assert "`gpupool stop-jobs` ends them" in log, log
    state, wrapper, workdir = job(running["id"])
    script_pid = int((Path(workdir) / "job.pid").read_text())
    assert state == "running" and _runs(wrapper) and _runs(script_pid)  # left running by the stop
    # one owner of the state folder at a time, kept by the kernel (flock): a hub started while
    # stop-jobs runs refuses to start, and a second stop-jobs refuses too
    from gpupool.host.state_lock import hold_state

    lock = hold_state(hub.state, "`gpupool stop-jobs`")
    try:
        with pytest.raises(RuntimeError, match="hub exited") as refused_start:
            hub._start(timeout=60)  # not start(): a refused start must not clear the running job away
        assert "not starting: " in str(refused_start.value), refused_start.value
        assert "in use by `gpupool stop-jobs`" in str(refused_start.value), refused_start.value
        busy = _stop_jobs(hub)
        assert busy.returncode == 1 and "in use by `gpupool stop-jobs`" in busy.stderr, busy
    finally:
        os.close(lock)
    assert job(running["id"])[0] == "running" and _runs(wrapper)  # neither touched it

    done = _stop_jobs(hub, config=False)  # the admin need not repeat `up --config`: it was kept
    assert done.returncode == 0, done
    assert (
        f"the config the last `gpupool up` on this state ran with: {hub.state / 'test_config.py'}"
        in done.stdout
    )
    assert f"stopped train job {running['id']} (runs) of ann: queued" in done.stdout, done
    assert queued["id"] not in done.stdout, done
    assert not _runs(wrapper) and not _runs(script_pid)
    assert job(running["id"])[:2] == ("queued", None) and job(queued["id"])[0] == "queued"
    con = sqlite3.connect(db)
    try:
        held = con.execute("SELECT owner, name FROM gpupool_allocations").fetchall()
        causes = con.execute(
            "SELECT data FROM gpupool_events WHERE kind = 'preempt' AND name = ?", (running["id"],)
        ).fetchall()
    finally:
        con.close()
    assert held == [] and len(causes) == 1 and "hub-stop" in causes[0][0], (held, causes)
    again = _stop_jobs(hub)
    assert again.returncode == 0 and "nothing to stop" in again.stdout, again


def test_a_stopping_pool_refuses_a_spawn_with_the_reason(tmp_path) -> None:
    from gpupool.hub.stopping import WHY
    from gpupool.pool.errors import HubStopping
    from tests.support.pools import make_pool

    pool = make_pool(tmp_path, 2)
    pool.stopping = WHY
    with pytest.raises(HubStopping, match="the hub is stopping") as err:
        pool.reserve_build("ann", [], "", 250)
    assert err.value.status == 503 and pool.store.allocations() == []


def test_make_clean_names_what_still_runs_as_an_account(tmp_path) -> None:
    from gpupool.host.account_cleanup import what_runs

    state, proc = tmp_path / "state", tmp_path / "proc"
    (state / "jobs" / "alice" / "train-7f3a").mkdir(parents=True)
    for pid, cwd, cmd in (
        (11, state / "jobs" / "alice" / "train-7f3a", b"python\0job.py"),
        (12, tmp_path, b"/x/jupyterhub-singleuser\0"),
    ):
        (proc / str(pid)).mkdir(parents=True)
        (proc / str(pid) / "cwd").symlink_to(cwd)
        (proc / str(pid) / "cmdline").write_bytes(cmd)
    said = what_runs([11, 12], str(state), proc)
    assert said == "jupyterhub-singleuser (pids 12); train job train-7f3a (pids 11)", said


def test_the_submission_rate_limit_survives_a_restart(tmp_path) -> None:
    """A restarted hub counts the last minute's submissions from its database: a user cannot
    restart the count by waiting for a restart (or causing one)."""
    import asyncio
    import time

    from gpupool.train.backend import LocalTraining
    from gpupool.train.request import JobCode, JobRequest
    from gpupool.train.volume import SubmitRate, recent_submissions
    from tests.support.pools import make_training

    svc = make_training(tmp_path, 1, projects={"lab": {"guarantee": 1}})
    wall = time.time()
    for k, at in enumerate(
        (wall - 90, wall - 30, wall - 20, wall - 10)
    ):  # the first one is over a minute ago
        job = JobRequest(
            owner="ann", project="lab", name=f"j{k}", num_gpu=1, gpu_milli=1000, code=JobCode.notebook(b"{}")
        )
        asyncio.run(LocalTraining(svc).submit(job, now=at))
    rate = SubmitRate(3)  # as a restarted hub makes it
    rate.seed(recent_submissions(svc.pool.store, wall), wall, 1000.0)
    assert "at most 3" in rate.refuse("ann", 1000.0) and "try again in 30 s" in rate.refuse("ann", 1000.0)
    assert rate.refuse("bob", 1000.0) == ""
    assert rate.refuse("ann", 1031.0) == ""  # the oldest of the three has left the minute


def test_make_clean_removes_the_hubs_cgroup_folders(tmp_path) -> None:
    from gpupool.contain import detect, hub_key
    from gpupool.host.account_cleanup import remove_cgroups

    state = tmp_path / "state"
    tree = detect("auto", hub_key(f"sqlite:///{state}/gpupool.sqlite"))
    if not tree.available:
        pytest.skip(f"no cgroups here: {tree.reason}")
    tree.make("a1b2c3d4e5f6/ws-0123")  # left by a stopped hub, empty
    assert remove_cgroups(str(state)) == [f"cgroup folder {tree.root}"]
    assert not tree.root.exists()


def test_a_stop_with_stop_jobs_sends_running_jobs_back_to_the_queue_and_starts_none(tmp_path) -> None:
    """`gpupool up --stop-jobs`: the running job is told to stop and goes back to the queue (it
    resumes at the next start); the queued one is not admitted while the hub stops."""
    import sys

    from gpupool.hub.stopping import WHY
    from tests.support.jobs import job_request
    from tests.support.pools import make_training, run_until

    svc = make_training(tmp_path, 1, projects={"lab": {"guarantee": 1}}, grace_s=5.0)
    waiter = "import os, time\nwhile not os.path.exists('release'):\n    time.sleep(0.02)\n"

    def submit(name: str):
        return svc.submit(
            job_request(
                owner="ann",
                project="lab",
                name=name,
                command=[sys.executable, "job.py"],
                files={"job.py": waiter.encode()},
            )
        ).id

    first = submit("first")
    run_until(svc, lambda: svc.job(first).state == "running" and svc.job(first).pid)
    second = submit("second")
    svc.pool.stopping = WHY  # what gpupool.hub.stopping.at_stop does first
    lines = svc.at_stop(end_jobs=True)
    assert "1 train job(s) told to stop" in lines[0], lines
    run_until(svc, lambda: svc.job(first).state == "queued")  # its run ended by the stop
    assert svc.job(second).state == "queued" and svc.pool.store.allocations() == []
    events = [e for e in svc.pool.store.events(limit=50) if e.name == first and e.kind == "preempt"]
    assert events and events[0].data["cause"] == "hub-stop"


def test_nothing_starts_once_the_databases_disk_is_down_to_its_reserve(tmp_path) -> None:
    """A user's files cannot take the space the hub records what runs in: below
    c.GPUPool.min_free_disk_mib on the databases' disk, spawns and job submissions are refused
    (507, with the reason) before anything is written. A reserve larger than the disk stands in
    for a disk a user filled."""
    import sys

    from gpupool.pool.errors import DiskReserve
    from tests.support.jobs import job_request
    from tests.support.pools import make_training

    svc = make_training(tmp_path, 2, projects={"lab": {"guarantee": 1}})
    pool = svc.pool
    pool.min_free_mib = 2**40  # 1 EiB: more than any disk has free
    with pytest.raises(DiskReserve, match="min_free_disk_mib") as err:
        pool.reserve_build("ann", [], "", 250)
    assert err.value.status == 507 and pool.store.allocations() == []
    job = job_request(owner="ann", project="lab", name="j", command=[sys.executable, "-c", "pass"])
    with pytest.raises(DiskReserve):
        svc.submit(job)
    assert svc.jobs() == []  # no folder, no row
    pool.min_free_mib = 1  # space again
    pool.reserve_build("ann", [], "", 250)
    assert svc.submit(job).state == "queued"


def test_a_full_disk_under_the_job_logs_stops_no_cancel_or_preemption(tmp_path, monkeypatch, caplog) -> None:
    """The hub's own lines in a job's log ("cancelled by ...", "preempted ...") go to the jobs'
    disk, which may be full while the database's is not: the cancel is recorded and its signal
    still goes out, so the job ends instead of running on as cancelled. /dev/full stands in for
    the job log: every write to it fails with ENOSPC, from the kernel."""
    import logging

    from gpupool.hub.stopping import WHY
    from gpupool.train import service
    from tests.support.jobs import job_request
    from tests.support.pools import make_training, run_until

    svc = make_training(tmp_path, 2, projects={"lab": {"guarantee": 2}}, grace_s=5.0)
    waiter = "import os, time\nwhile not os.path.exists('release'):\n    time.sleep(0.02)\n"

    def submit(name: str) -> str:
        files = {"job.py": waiter.encode()}
        request = job_request(
            owner="ann", project="lab", name=name, command=[sys.executable, "job.py"], files=files
        )
        return svc.submit(request).id

    cancelled, preempted = submit("cancelled"), submit("preempted")
    try:
        run_until(
            svc, lambda: all(svc.job(j).state == "running" and svc.job(j).pid for j in (cancelled, preempted))
        )
        monkeypatch.setattr(
            service, "open_file", lambda *a, **k: os.open("/dev/full", os.O_WRONLY | os.O_APPEND)
        )
        with caplog.at_level(logging.WARNING, logger="gpupool.train"):
            svc.cancel(cancelled, by="ann")
            svc.pool.stopping = WHY  # as a stopping hub: the preempted job is not started again
            svc.at_stop(end_jobs=True)  # the other one is preempted back to the queue
            run_until(
                svc, lambda: svc.job(cancelled).state == "cancelled" and svc.job(preempted).state == "queued"
            )
        assert svc.pool.store.allocations() == []
        said = [r.getMessage() for r in caplog.records if "cannot write to the log of job" in r.getMessage()]
        assert any(cancelled in m and "No space left" in m for m in said), said
        assert any(preempted in m for m in said), said
    finally:  # a failing run leaves no job behind: the waiters end
        for job_id in (cancelled, preempted):
            Path(svc.job(job_id).workdir, "release").touch()


def test_a_submission_that_meets_a_full_disk_leaves_no_folder_and_no_row(tmp_path, monkeypatch) -> None:
    """The job's code cannot be written (the jobs' disk full: /dev/full stands in for the file,
    ENOSPC from the kernel): the submission fails as a full disk (the API's 507, "nothing was
    changed"), and what it had begun, the job's folder, is gone: it would take more of the full
    disk, and show as a job that never was."""
    from gpupool.train import book
    from gpupool.vocab.disk import disk_full
    from tests.support.jobs import job_request
    from tests.support.pools import make_training

    svc = make_training(tmp_path, 1, projects={"lab": {"guarantee": 1}})
    files = {"job.py": b"print(1)\n" * 1000}
    request = job_request(
        owner="ann", project="lab", name="j", command=[sys.executable, "job.py"], files=files
    )
    first = svc.submit(request)  # room: its folder stays
    monkeypatch.setattr(book, "open_file", lambda *a, **k: os.open("/dev/full", os.O_WRONLY))
    with pytest.raises(OSError) as err:
        svc.submit(request)
    assert "No space left" in disk_full(err.value)  # said as a full disk: 507
    assert [r.id for r in svc.jobs()] == [first.id]
    assert [p.name for p in Path(first.workdir).parent.iterdir()] == [Path(first.workdir).name]


def test_a_sweep_that_meets_a_full_disk_on_its_third_run_leaves_nothing_queued(tmp_path, monkeypatch) -> None:
    """The API says a full disk changed nothing (507), so a sweep is queued whole or not at all:
    the two runs queued before the disk filled are cancelled, with the reason their owner
    reads, and the error says so."""
    import asyncio

    from gpupool.api.auth import noted
    from gpupool.train import book
    from gpupool.train.backend import LocalTraining, submit_whole
    from gpupool.vocab.disk import disk_full
    from gpupool.vocab.states import JobState
    from tests.support.jobs import job_request
    from tests.support.pools import make_training

    svc = make_training(tmp_path, 1, projects={"lab": {"guarantee": 1}})
    runs = [
        job_request(
            owner="ann",
            project="lab",
            name=f"grid-{i}",
            command=[sys.executable, "job.py"],
            files={"job.py": b"1"},
        )
        for i in (1, 2, 3)
    ]
    submit = svc.submit

    def disk_fills_at_the_third(job, now=None):  # the third run's code meets a full disk
        if job.name == "grid-3":
            monkeypatch.setattr(book, "open_file", lambda *a, **k: os.open("/dev/full", os.O_WRONLY))
        return submit(job, now)

    monkeypatch.setattr(svc, "submit", disk_fills_at_the_third)
    with pytest.raises(OSError) as err:
        asyncio.run(submit_whole(LocalTraining(svc), runs))
    assert "No space left" in disk_full(err.value)
    assert "the 2 run(s) of the sweep queued before it were cancelled" in noted(err.value)
    assert svc.jobs(state=JobState.QUEUED) == []
    assert {r.name: r.state for r in svc.jobs()} == {
        "grid-1": JobState.CANCELLED,
        "grid-2": JobState.CANCELLED,
    }
    assert all("could not be queued whole" in r.message for r in svc.jobs())
