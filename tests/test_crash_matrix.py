"""The crash matrix: a real hub dies (os._exit at a named failpoint, see gpupool.hub.failpoints)
in the middle of a spawn, a stop, a job's start, a preemption, a resume and a cancel, with
real server and job processes; it is restarted and must hold every invariant:

no leaked or doubled share, no GPU over 1000 milli, no quota exceeded, no orphan process
(servers and jobs are adopted or stopped), no job run twice, no cancelled job resurrected,
and the queue is not wedged. Jobs and waits follow files and states, never the clock.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from gpupool.hub.failpoints import EXIT_CODE, POINTS
from tests.hubtools import Hub
from tests.support.wait import until

pytestmark = pytest.mark.hub
J = "/services/gpupool/api/jobs"
CONFIG = """
c.TrainPool.tick_s = 0.3
c.TrainPool.grace_s = 2
c.TrainPool.train_gpus = [0]
c.TrainPool.projects = {"lab": {"guarantee": 0}, "own": {"guarantee": 1}}
"""
# a job that records each run and ends when the test writes "go" in its folder
WAITER = """
import os, time
open("starts.txt", "a").write(f"{os.getpid()}\\n")
while not os.path.exists("go"):
    time.sleep(0.05)
print("finished")
"""
TERMINAL = {"succeeded", "failed", "cancelled"}


def submit(hub: Hub, token: str, project: str, name: str) -> dict:
    return hub.api("POST", J, {"project": project, "gpus": 1, "name": name, "script": WAITER}, token=token)


def job(hub: Hub, token: str, job_id: str) -> dict:
    return hub.api("GET", f"{J}/{job_id}", token=token)


def state_is(hub: Hub, token: str, job_id: str, *states: str):
    return lambda: job(hub, token, job_id)["state"] in states


def hub_down(hub: Hub, timeout: float = 90) -> int:
    assert hub.proc is not None
    return hub.proc.wait(timeout)


def quietly(call, *args, **kw) -> None:
    """A request that reaches the failpoint: the hub may die before it answers."""
    try:
        call(*args, **kw)
    except Exception:  # noqa: BLE001 - the connection drops (or the proxy says 503) when the hub exits
        pass


# --- what each failpoint needs to be reached ------------------------------------------
def reach_spawn(hub: Hub, token: str) -> None:
    quietly(hub.spawn, "ann", "0.5", wait=False)


def reach_stop(hub: Hub, token: str) -> None:
    hub.spawn("ann", "0.5")
    quietly(hub.api, "DELETE", "/hub/api/users/ann/server")


def reach_train_start(hub: Hub, token: str) -> None:
    quietly(submit, hub, token, "own", "first")


def reach_preempt(hub: Hub, token: str) -> None:
    borrower = submit(hub, token, "lab", "borrower")
    until(state_is(hub, token, borrower["id"], "running"), "the borrower running", detail=hub.tail)
    quietly(submit, hub, token, "own", "owner")  # takes its guarantee back: the borrower is preempted


def reach_resume(hub: Hub, token: str) -> None:
    borrower = submit(hub, token, "lab", "borrower")
    until(state_is(hub, token, borrower["id"], "running"), "the borrower running", detail=hub.tail)
    owner = submit(hub, token, "own", "owner")
    running = until(
        lambda: (j := job(hub, token, owner["id"]))["state"] == "running" and j, "the owner", detail=hub.tail
    )
    Path(running["workdir"], "go").touch()  # the owner ends; the borrower resumes


def reach_cancel(hub: Hub, token: str) -> None:
    first = submit(hub, token, "own", "first")
    until(state_is(hub, token, first["id"], "running"), "the job running", detail=hub.tail)
    quietly(hub.api, "DELETE", f"{J}/{first['id']}", token=token)


REACH = {
    "spawn.reserved": reach_spawn,
    "spawn.started": reach_spawn,
    "stop.stopped": reach_stop,
    "train.start.reserved": reach_train_start,
    "train.start.recorded": reach_train_start,
    "train.start.spawned": reach_train_start,
    "train.resume.recorded": reach_resume,
    "train.preempt.persisted": reach_preempt,
    "train.cancel.persisted": reach_cancel,
}


# --- the invariants -----------------------------------------------------------------------
def processes(*markers: bytes) -> list[int]:
    """Live (not zombie) processes whose environment and command line hold every marker."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            if (proc / "stat").read_text().rsplit(")", 1)[1].split()[0] == "Z":
                continue
            seen = (proc / "environ").read_bytes() + (proc / "cmdline").read_bytes()
            if all(m in seen for m in markers):
                found.append(int(proc.name))
        except OSError:
            continue
    return found


def check_shares(hub: Hub) -> None:
    shares = hub.allocations()
    per_gpu: dict[tuple[str, int], int] = {}
    per_owner: dict[str, int] = {}
    seen = set()
    for s in shares:
        per_gpu[(s["node"], s["gpu"])] = per_gpu.get((s["node"], s["gpu"]), 0) + s["milli"]
        if s["kind"] == "build":
            per_owner[s["owner"]] = per_owner.get(s["owner"], 0) + s["milli"]
        key = (s["kind"], s["owner"], s.get("name"), s["gpu"])
        assert key not in seen, f"doubled share {key}"
        seen.add(key)
    assert all(v <= 1000 for v in per_gpu.values()), per_gpu
    assert all(v <= 1000 for v in per_owner.values()), per_owner  # the default build quota: 1 GPU


def settle(hub: Hub, token: str) -> list[dict]:
    """Let every job end: each run that starts gets its "go"; returns the jobs at the end."""

    def all_done():
        jobs = hub.api("GET", J, token=token)["jobs"]
        for j in jobs:
            if j["state"] == "running":
                Path(j["workdir"], "go").touch()
        return [jobs] if all(j["state"] in TERMINAL for j in jobs) else None

    return until(all_done, "every job ending", timeout=120, detail=hub.tail)[0]


@pytest.mark.parametrize(
    "point", sorted(p for p in POINTS if not p.startswith("move."))
)  # moves: test_move_hub.py
def test_a_hub_killed_at_each_failpoint_restarts_with_every_invariant_held(make_hub, point: str) -> None:
    hub: Hub = make_hub(CONFIG, env={"GPUPOOL_CULLER": "0", "GPUPOOL_FAILPOINT": point}).start()
    token = hub.user_token("ann")
    REACH[point](hub, token)
    assert hub_down(hub) == EXIT_CODE, hub.tail()  # died exactly at the point
    del hub.env["GPUPOOL_FAILPOINT"]
    hub.start()

    check_shares(hub)
    jobs = settle(hub, token)
    check_shares(hub)
    for j in jobs:
        starts = Path(j["workdir"], "starts.txt")
        runs = len(starts.read_text().split()) if starts.exists() else 0
        log = Path(j["workdir"], "job.log").read_text() if Path(j["workdir"], "job.log").exists() else ""
        assert runs <= j["preemptions"] + 1, f"job {j['name']} ran {runs} times: {j}"
        assert log.count("finished") == (1 if j["state"] == "succeeded" else 0), j
        if point == "train.cancel.persisted":
            assert j["state"] == "cancelled" and runs == 1, j  # never resurrected
        else:
            assert j["state"] == "succeeded", j
    assert not [s for s in hub.allocations() if s["kind"] == "train"]  # every job's GPUs came back
    until(
        lambda: not processes(str(hub.state).encode(), b"runners/wrap.py"),
        "no job process left",
        detail=hub.tail,
    )

    # workspaces: a server the hub does not know as running has no process and no share
    server = hub.api("GET", "/hub/api/users/ann").get("servers", {}).get("")
    ours = (b"GPUPOOL_WORKSPACE=ann/", f"HOME={hub.state}/".encode())
    if not server:
        until(lambda: not processes(*ours), "the orphaned server stopped", detail=hub.tail)
        assert not [s for s in hub.allocations() if s["kind"] == "build"]
        hub.spawn("ann", "0.5")  # and the user can start again, with one share
    assert [s["milli"] for s in hub.allocations() if s["kind"] == "build"] == [500]
    check_shares(hub)

    # the queue is not wedged (the workspace may sit on the train GPU: it goes first)
    hub.stop_server("ann")
    assert not hub.allocations()
    new = submit(hub, token, "own", "after")
    running = until(
        lambda: (j := job(hub, token, new["id"]))["state"] == "running" and j, "a new job", detail=hub.tail
    )
    Path(running["workdir"], "go").touch()
    until(state_is(hub, token, new["id"], "succeeded"), "the new job succeeding", detail=hub.tail)
