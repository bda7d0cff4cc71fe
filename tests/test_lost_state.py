"""State is never lost silently: a hub whose database was moved aside, emptied, swapped for another
instance's or made unreadable while its servers and jobs ran refuses to start, with the reason and
what to do, instead of showing their GPUs free; `gpupool backup` / `gpupool restore` bring the state
back; a stored admin setting that no longer validates is reported and skipped, the API stays up.

Real hubs, crashed (kill -9) with real servers and jobs running, as in a real outage.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from gpupool.contain import detect, hub_key
from tests.hubtools import Hub

pytestmark = pytest.mark.hub
J = "/services/gpupool/api/jobs"
CONFIG = """
c.TrainPool.tick_s = 0.3
c.TrainPool.projects = {"lab": {"guarantee": 1}}
"""
WAITER = """
import os, time
while not os.path.exists("go"):
    time.sleep(0.05)
"""
DB = "gpupool.sqlite"


def refused_start(hub: Hub) -> str:
    """Start the hub, which must exit; what it wrote (the admin reads it). The servers stay up."""
    before = hub.log_path.stat().st_size
    with pytest.raises(RuntimeError, match="hub exited"):
        hub._start(timeout=60)  # not start(): that would clear away the servers it refused to forget
    text = hub.log_path.read_bytes()[before:].decode(errors="replace")
    return "\n".join(line for line in text.splitlines() if "ConfigProxy" not in line)


def move_aside(state: Path) -> Path:
    aside = state / "aside"
    aside.mkdir(exist_ok=True)
    for suffix in ("", "-wal", "-shm"):
        if (state / (DB + suffix)).exists():
            os.replace(state / (DB + suffix), aside / (DB + suffix))
    return aside


def put_back(state: Path, aside: Path) -> None:
    for suffix in ("", "-wal", "-shm"):
        (state / (DB + suffix)).unlink(missing_ok=True)
        if (aside / (DB + suffix)).exists():
            os.replace(aside / (DB + suffix), state / (DB + suffix))


def running_job(hub: Hub, token: str) -> dict:
    job = hub.api("POST", J, {"project": "lab", "gpus": 1, "name": "keep", "script": WAITER}, token=token)
    return hub.wait_job(job["id"], {"running"}, token)


def another_instances_database(path: Path) -> None:
    """A gpupool database of another hub (another instance id), as a mixed-up restore brings."""
    from gpupool.host.instance import SETTING
    from gpupool.store import Store

    store = Store(f"sqlite:///{path}")
    store.put_setting(SETTING, {"id": "0123456789ab"})
    store.engine.dispose()


def test_a_hub_whose_database_was_lost_while_servers_and_jobs_run_refuses_to_start(make_hub) -> None:
    hub: Hub = make_hub(CONFIG, env={"GPUPOOL_CULLER": "0"}).start()
    hub.spawn("ann", 0.5)
    job = running_job(hub, hub.user_token("ann"))
    hub.kill9()  # the servers, the job and the proxy keep running, as in a real crash
    aside = move_aside(hub.state)
    for loss, says in (
        ("moved aside", "no instance id"),
        ("emptied", "no instance id"),
        ("another instance's", "belongs to instance 0123456789ab"),
    ):
        for suffix in ("", "-wal", "-shm"):
            (hub.state / (DB + suffix)).unlink(missing_ok=True)
        if loss == "emptied":
            (hub.state / DB).write_bytes(b"")
        elif loss == "another instance's":
            another_instances_database(hub.state / DB)
        log = refused_start(hub)
        assert "gpupool will not start" in log and "still run" in log and "gpupool restore" in log, (
            loss,
            log,
        )
        assert says in log, (loss, log)

    put_back(hub.state, aside)  # what the message says to do
    hub.start()
    shares = hub.allocations()
    assert sorted((s["kind"], s["milli"]) for s in shares) == [("build", 500), ("train", 1000)], shares
    token = hub.user_token("ann")
    assert hub.api("GET", f"{J}/{job['id']}", token=token)["state"] == "running"
    Path(job["workdir"], "go").touch()
    assert hub.wait_job(job["id"], {"succeeded", "failed"}, token)["state"] == "succeeded"


def test_an_unreadable_database_stops_the_hub_with_the_reason(make_hub) -> None:
    hub: Hub = make_hub(CONFIG, env={"GPUPOOL_CULLER": "0"}).start()
    hub.stop()
    for suffix in ("-wal", "-shm"):  # its pages may still be in the write-ahead log
        (hub.state / (DB + suffix)).unlink(missing_ok=True)
    (hub.state / DB).write_bytes(b"this is not a database" * 100)
    log = refused_start(hub)
    assert "gpupool will not start" in log and "cannot be used" in log and "not a database" in log, log


def gpupool(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "gpupool.wiring.cli", *args], capture_output=True, text=True, timeout=120
    )


def test_backup_and_restore_bring_a_lost_database_back(make_hub, tmp_path: Path) -> None:
    hub: Hub = make_hub(CONFIG, env={"GPUPOOL_CULLER": "0"}).start()
    hub.spawn("ann", 0.5)
    backup = tmp_path / "backup"
    made = gpupool("backup", "--state", str(hub.state), str(backup))  # while the hub runs
    assert made.returncode == 0, made.stderr
    assert oct(backup.stat().st_mode & 0o777) == "0o700" and (backup / DB).exists()
    refused = gpupool("restore", "--state", str(hub.state), str(backup))
    assert refused.returncode == 1 and "stop it first" in refused.stderr
    # after the backup: a job and another server start; the backup knows neither
    job = running_job(hub, hub.user_token("ann"))
    hub.spawn("bob", 0.5)
    hub.kill9()
    (hub.state / DB).unlink()  # lost
    for suffix in ("-wal", "-shm"):
        (hub.state / (DB + suffix)).unlink(missing_ok=True)
    assert "gpupool will not start" in refused_start(hub)
    restored = gpupool("restore", "--state", str(hub.state), str(backup))
    assert restored.returncode == 0, restored.stderr
    assert "moved" in restored.stdout  # the empty file the refused start made is kept aside, not deleted
    tree = detect("auto", hub_key(f"sqlite:///{hub.state}/{DB}"))
    if tree.available:  # each workload's cgroup tells what runs (the hub is root)
        log = refused_start(hub)  # not handing the job's and bob's GPUs out again
        assert "2 workload(s) of this hub run that its database" in log and "does not know" in log, log
        assert f"train job {job['id']}" in log and "a workspace of bob" in log, log
        for group in re.findall(r"\(cgroup (\S+), pids", log):  # what the message says to do: end them
            tree.end(str(Path(group).relative_to(tree.root)))
    hub.start()
    assert [(s["owner"], s["milli"]) for s in hub.allocations()] == [("ann", 500)]
    hub.stop_server("ann")
    assert hub.allocations() == []


POOLS = """
c.TrainPool.node_pools = {"dgx": {"gpus": [0, 1]}, "small": {"gpus": [2, 3]}}
"""


def test_a_stored_setting_that_no_longer_validates_is_reported_and_skipped(make_hub) -> None:
    hub: Hub = make_hub(CONFIG + POOLS, env={"GPUPOOL_CULLER": "0"}).start()
    q = "/services/gpupool/api/quotas"
    hub.api("PUT", q, {"group_overrides": {"lab": {"quota": 2, "pools": ["dgx"]}}})
    status, message = hub.api_error("PUT", q, {"group_overrides": {"lab": {"pools": ["nowhere"]}}})
    assert status == 400 and "nowhere" in message and "node_pools" in message, message
    status, message = hub.api_error("PUT", q, {"allowed_fractions": [0.5, 0.25, 0.5]})
    assert status == 400 and "repeated" in message, message
    status, message = hub.api_error("PUT", q, {"allowed_fractions": [0.5] * 10_000})
    assert status == 400 and len(message) < 300, message[:300]
    hub.stop()
    hub.extra_config = CONFIG  # the admin removed the node pools from the config
    hub.start()
    quotas = hub.api("GET", q)
    assert "no longer validate" in quotas["skipped"] and "dgx" in quotas["skipped"], quotas
    assert "lab" not in quotas["quotas"]["group_overrides"]
    hub.spawn("ann", 0.25)  # the API and spawning work
    events = hub.api("GET", "/services/gpupool/api/events?kind=setting-skipped")["events"]
    assert events and "dgx" in events[0]["message"]
    hub.api("PUT", q, {"default_build_quota": 0.5})  # a new change replaces the skipped one
    assert "skipped" not in hub.api("GET", q)


def test_the_config_file_refuses_duplicate_sizes() -> None:
    from traitlets import TraitError
    from traitlets.config import Config

    from gpupool.wiring.setup import validate

    for setting, value in (
        ("allowed_fractions", [0.25, 0.25]),
        ("group_overrides", {"g": {"fractions": [0.5, 1, 0.5]}}),
    ):
        c = Config()
        setattr(c.GPUPool, setting, value)
        with pytest.raises(TraitError, match="repeated"):
            validate(c)
    c = Config()
    c.GPUPool.build_pools = ["nowhere"]
    with pytest.raises(TraitError, match="not in TrainPool.node_pools"):
        validate(c)
