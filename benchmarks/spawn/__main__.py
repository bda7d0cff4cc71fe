"""Spawn-to-ready latency: gpupool's spawner vs JupyterHub's SimpleLocalProcessSpawner.

Two hubs run side by side on 127.0.0.1 with the same config except the spawner; spawns
alternate between them (A, B, A, B, ...) so machine noise hits both alike. Each spawn is
timed from the REST call to the moment the hub reports the server ready, then stopped; the
server process's CPU time at that moment says whether gpupool made the server itself slower
(its GPU environment, sitecustomize, cgroup) apart from when the hub noticed it.

    python -m benchmarks.spawn [--spawns 24]

The last line gives the ratio of the medians and whether the target (within 10 % of
JupyterHub's own spawner) is met.
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

OURS = "gpupool.spawner.GPUSimpleLocalProcessSpawner"
BASELINE = "jupyterhub.spawner.SimpleLocalProcessSpawner"


def spawn_once(hub: Hub, user: str, body: dict | None) -> tuple[float, float]:
    """Seconds to ready, and the server's CPU seconds by then."""
    t0 = time.perf_counter()
    hub.api("POST", f"/hub/api/users/{user}/server", body)
    while True:
        server = hub.api("GET", f"/hub/api/users/{user}")["servers"].get("")
        if server and server["ready"]:
            elapsed = time.perf_counter() - t0
            break
        time.sleep(0.02)
    cpu = cpu_seconds((server.get("state") or {}).get("pid"))
    hub.stop_server(user)
    return elapsed, cpu


def cpu_seconds(pid: int | None) -> float:
    if not pid:
        return float("nan")
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime


def p90(values: list[float]) -> float:
    return statistics.quantiles(values, n=10)[-1]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.spawn", description=__doc__)
    parser.add_argument("--spawns", type=int, default=24, help="spawns per spawner (default 24)")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        ours = Hub(state=Path(tmp) / "ours", env={"GPUPOOL_SPAWNER": OURS})
        base = Hub(state=Path(tmp) / "base", env={"GPUPOOL_SPAWNER": BASELINE})
        try:
            for hub in (ours, base):
                hub.start()
                hub.api("POST", "/hub/api/users/bench")
            spawn_once(ours, "bench", {"gpus": 0.25})  # warm-up: imports, disk caches
            spawn_once(base, "bench", None)
            times: dict[str, list[float]] = {"gpupool": [], "baseline": []}
            cpu: dict[str, list[float]] = {"gpupool": [], "baseline": []}
            for i in range(args.spawns):
                for key, hub, body in (("gpupool", ours, {"gpus": 0.25}), ("baseline", base, None)):
                    took, used = spawn_once(hub, "bench", body)
                    times[key].append(took)
                    cpu[key].append(used)
                print(f"\rspawn {i + 1}/{args.spawns}", end="", file=sys.stderr, flush=True)
            print(file=sys.stderr)
        finally:
            ours.stop()
            base.stop()
    med = {k: statistics.median(v) for k, v in times.items()}
    tail = {k: p90(v) for k, v in times.items()}
    used = {k: statistics.median(v) for k, v in cpu.items()}
    print(f"spawn-to-ready over {args.spawns} spawns each (seconds)")
    print("| spawner | median | p90 | server CPU to ready (median) |")
    print("|---|---|---|---|")
    print(
        f"| SimpleLocalProcessSpawner (baseline) | {med['baseline']:.2f} | {tail['baseline']:.2f} |"
        f" {used['baseline']:.2f} |"
    )
    print(
        f"| gpupool GPUSimpleLocalProcessSpawner | {med['gpupool']:.2f} | {tail['gpupool']:.2f} |"
        f" {used['gpupool']:.2f} |"
    )
    ratio = med["gpupool"] / med["baseline"]
    print(
        f"| ratio gpupool / baseline | {ratio:.3f} | {tail['gpupool'] / tail['baseline']:.3f} |"
        f" {used['gpupool'] / used['baseline']:.3f} |"
    )
    verdict = "met" if ratio <= 1.10 else "NOT met"
    print(
        f"spawn: gpupool {ratio:.2f}x JupyterHub's own spawner, median spawn-to-ready (target <= 1.10x: {verdict})"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
