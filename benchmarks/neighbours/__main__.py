"""Noisy neighbours: hostile workloads beside a quiet user, on one real hub (as root, cgroup v1).

Three users' train jobs try what a student in a teaching lab would: a fork storm, a memory hog, a
CPU spin on every core, and opening every GPU device node (made with mknod: no GPU needed) after
widening CUDA_VISIBLE_DEVICES. Meanwhile a quiet user calls the hub's API and spawns a server;
the same user's figures with no hostile job running, measured first in the same run, are the
baseline.

    python -m benchmarks.neighbours [--seconds 20]

A second phase is the flood of the issue (#34): three users, each within every cap, submit a
20-run sweep of a 1,000-cell notebook that computes in every cell, while the quiet user calls
the API and spawns again.

Escapes counted: a device node of another GPU that opened (not EPERM), a fork storm past the
process limit, a memory hog that survived past its limit. The last line gives the verdict against
the targets: 0 escapes; the quiet user's API p99 <= 1 s and <= 2x the baseline; spawn <= 2x.
Not a test (minutes, and it loads the machine); nothing here is in the test suite.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from tests.hubtools import Hub

MEMORY_LIMIT = "512M"
PIDS_LIMIT = 256
CONFIG = f"""
c.Containment.memory_limit = "{MEMORY_LIMIT}"
c.Containment.pids_limit = {PIDS_LIMIT}
c.TrainPool.tick_s = 0.3
c.TrainPool.projects = {{"lab": {{"guarantee": 3}}}}
c.TrainPool.train_gpus = [0, 1, 2]  # GPU 3 for workspaces: the quiet user's spawn finds room
"""
J = "/services/gpupool/api/jobs"
HOSTILE = {
    "storm": """
import os, time
n = 0
try:
    while n < 5000:
        if os.fork() == 0:
            os.closerange(0, 3)
            while not os.path.exists({stop!r}):
                time.sleep(0.5)
            os._exit(0)
        n += 1
except OSError:
    pass
print("forked", n, flush=True)
while not os.path.exists({stop!r}):  # the job lasts while its children run
    time.sleep(0.1)
""",
    "hog": """
chunks = []
for i in range(32):  # 2 GiB in 64 MiB steps, each written
    chunks.append(b"x" * (64 << 20))
print("hog survived", flush=True)
""",
    "spin": """
import os, time
for _ in range(2 * os.cpu_count()):
    if os.fork() == 0:
        end = time.monotonic() + 600
        while time.monotonic() < end and not os.path.exists({stop!r}):
            for _ in range(100000):
                pass
        os._exit(0)
while not os.path.exists({stop!r}):
    time.sleep(0.1)
""",
    "opens": """
import errno, os
own = os.environ.get("CUDA_VISIBLE_DEVICES", "")
os.environ["CUDA_VISIBLE_DEVICES"] = "0,1,2,3"
for minor in range(4):
    try:
        os.close(os.open(os.path.join({nodes!r}, f"nvidia{{minor}}"), os.O_RDWR))
        result = "opened"
    except OSError as err:
        result = errno.errorcode[err.errno]
    print("open", minor, own, result, flush=True)
""",
}


SWEEP_RUNS = 20  # c.TrainPool.max_sweep_runs' default: the most one user may ask
SWEEP_CELLS = 1000
SWEEP_CELL = "s = sum(i * i for i in range(20000))"  # a few ms of CPU in every cell


def sweep_flood(hub: Hub) -> list[tuple[str, str]]:
    """Three users' sweeps of a computing notebook: (job id, owner's token) of every run."""
    runs = []
    for i in range(3):
        token = hub.user_token(f"sweeper{i}")
        body = {
            "project": "lab",
            "gpus": 0.25,
            "name": "flood",
            "code": [SWEEP_CELL] * SWEEP_CELLS,
            "sweep": {"lr": list(range(SWEEP_RUNS // 2)), "batch": [32, 64]},  # at most 16 values a key
        }
        made = hub.api("POST", J, body, token=token, timeout=180)  # 20 notebooks written: slow when loaded
        runs += [(j["id"], token) for j in made["jobs"]]
    return runs


def api_p99(hub: Hub, token: str, seconds: float) -> tuple[float, int]:
    """The quiet user's own page of the hub API, called back to back for `seconds`."""
    times = []
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        t0 = time.perf_counter()
        hub.api("GET", "/hub/api/user", token=token)
        times.append(time.perf_counter() - t0)
    return statistics.quantiles(times, n=100)[-1], len(times)


def spawn_s(hub: Hub, user: str) -> float:
    """Seconds to a ready server; inf when it never became ready (the hub's start timeout, 120 s
    here, ended it): the phase then misses the target instead of ending the benchmark."""
    t0 = time.perf_counter()
    try:
        hub.spawn(user, 0.25, timeout=300)
    except (AssertionError, TimeoutError, OSError) as err:  # OSError: the API refused or timed out
        print(f"spawn of {user} failed after {time.perf_counter() - t0:.0f} s: {str(err)[:200]}", flush=True)
        return float("inf")
    took = time.perf_counter() - t0
    hub.stop_server(user)
    return took


def escapes(hub: Hub, jobs: dict[str, tuple[dict, str]]) -> list[str]:
    out = []
    for kind, (job, token) in jobs.items():
        row = hub.api("GET", f"{J}/{job['id']}", token=token)
        log = Path(row["workdir"], "job.log").read_text(errors="replace") if row.get("workdir") else ""
        if kind == "opens":
            for line in log.splitlines():
                if line.startswith("open "):
                    _, minor, own, result = line.split()
                    if minor != own and result != "EPERM":
                        out.append(f"GPU {minor} opened ({result}) by a job on GPU {own}")
        if kind == "storm":
            forked = [int(x.split()[1]) for x in log.splitlines() if x.startswith("forked ")]
            if not forked or forked[0] >= PIDS_LIMIT:
                out.append(f"fork storm: {forked or 'no count'} processes (limit {PIDS_LIMIT})")
        if kind == "hog" and ("hog survived" in log or "memory limit" not in (row.get("message") or "")):
            out.append(f"memory hog: {row['state']}: {row.get('message')!r}")
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.neighbours", description=__doc__)
    parser.add_argument("--seconds", type=float, default=20, help="API calls per phase (default 20 s)")
    parser.add_argument(
        "--jobs-cpu-shares",
        type=int,
        default=1024,
        help="c.Containment.jobs_cpu_shares: the train jobs' weight together against a workspace's 1024",
    )
    parser.add_argument(
        "--hub-cpu-shares",
        type=int,
        default=8192,
        help="c.Containment.hub_cpu_shares: the hub's processes together (0: 1024 each, where they started)",
    )
    args = parser.parse_args(argv)
    if os.geteuid() != 0:
        print("neighbours: needs root (cgroups, accounts)", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory() as tmp:
        nodes = Path(tempfile.mkdtemp(prefix="gpupool-devs-"))
        nodes.chmod(0o755)
        for minor in range(4):
            os.mknod(nodes / f"nvidia{minor}", 0o020666, os.makedev(195, minor))
            (nodes / f"nvidia{minor}").chmod(0o666)
        stop = Path(tempfile.mkdtemp(prefix="gpupool-stop-"))
        stop.chmod(0o755)
        stop_file = str(stop / "stop")
        hub = Hub(
            state=Path(tmp) / "hub",
            extra_config=CONFIG
            + f"c.Containment.jobs_cpu_shares = {args.jobs_cpu_shares}\n"
            + f"c.Containment.hub_cpu_shares = {args.hub_cpu_shares}\n",
            env={"GPUPOOL_CULLER": "0"},
        )
        try:
            hub.start(timeout=600)  # a first start on a new version makes the users' environment
            quiet = hub.user_token("quiet")
            spawn_s(hub, "quiet")  # warm-up: imports, disk caches
            base_p99, base_n = api_p99(hub, quiet, args.seconds)
            base_spawn = spawn_s(hub, "quiet")
            jobs = {}
            for i, (kind, script) in enumerate(HOSTILE.items()):
                token = hub.user_token(f"hostile{i % 3}")
                code = script.format(stop=stop_file, nodes=str(nodes))
                body = {"project": "lab", "gpus": 0.25, "name": kind, "script": code}
                jobs[kind] = (hub.api("POST", J, body, token=token), token)
            time.sleep(3)  # the jobs start (tick 0.3 s) and load the machine
            load_p99, load_n = api_p99(hub, quiet, args.seconds)
            load_spawn = spawn_s(hub, "quiet")
            Path(stop_file).touch()
            for job, token in jobs.values():
                hub.wait_job(job["id"], {"succeeded", "failed", "cancelled"}, token, timeout=120)
            found = escapes(hub, jobs)
            runs = sweep_flood(hub)
            time.sleep(3)  # the runs start (tick 0.3 s): as many as the GPUs' quarters allow
            started = sum(hub.api("GET", f"{J}/{j}", token=t)["state"] == "running" for j, t in runs)
            flood_p99, flood_n = api_p99(hub, quiet, args.seconds)
            flood_spawn = spawn_s(hub, "quiet")
            for j, t in runs:
                hub.api("DELETE", f"{J}/{j}", token=t)
        finally:
            Path(stop_file).touch()
            hub.stop()
            for p in (nodes, stop):
                for f in p.iterdir():
                    f.unlink()
                p.rmdir()
    print(
        f"quiet user beside a fork storm, a {MEMORY_LIMIT} memory hog, a CPU spin and device opens; then a sweep flood"
        f" (train jobs together weigh {args.jobs_cpu_shares} against a workspace's 1024;"
        f" the hub's processes {args.hub_cpu_shares or '1024 each'} against all workloads' 256)"
    )
    print("| phase | API p99 (s) | API calls | spawn (s) |")
    print("|---|---|---|---|")
    print(f"| baseline (no hostile job) | {base_p99:.3f} | {base_n} | {base_spawn:.2f} |")
    print(f"| hostile jobs running | {load_p99:.3f} | {load_n} | {load_spawn:.2f} |")
    print(
        f"| sweep flood: 3 x {SWEEP_RUNS} runs of {SWEEP_CELLS} cells, {started} running |"
        f" {flood_p99:.3f} | {flood_n} | {flood_spawn:.2f} |"
    )
    for e in found:
        print(f"escape: {e}")
    p99, spawn = max(load_p99, flood_p99), max(load_spawn, flood_spawn)  # the worse phase
    ok = not found and p99 <= 1.0 and p99 <= 2 * base_p99 and spawn <= 2 * base_spawn
    print(
        f"VERDICT neighbours: {len(found)} escapes; worse phase API p99 {p99:.3f} s"
        f" ({p99 / base_p99:.2f}x baseline), spawn {spawn:.2f} s ({spawn / base_spawn:.2f}x)"
        f" (targets: 0, <= 1 s and <= 2x, <= 2x: {'met' if ok else 'NOT met'})"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
