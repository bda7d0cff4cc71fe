"""Spawn-to-ready latency: gpupool's spawner vs JupyterHub's SimpleLocalProcessSpawner.

Two hubs run side by side on 127.0.0.1 with the same config except the spawner; spawns
alternate between them (A, B, A, B, ...) so machine noise hits both alike. Each spawn is
timed from the REST call to the moment the hub reports the server ready, then stopped.

    python -m benchmarks.spawn [--spawns 12]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

from tests.hubtools import Hub

OURS = "gpupool.spawner.GPUSimpleLocalProcessSpawner"
BASELINE = "jupyterhub.spawner.SimpleLocalProcessSpawner"


def spawn_once(hub: Hub, user: str, body: dict | None) -> float:
    t0 = time.perf_counter()
    hub.api("POST", f"/hub/api/users/{user}/server", body)
    while True:
        server = hub.api("GET", f"/hub/api/users/{user}")["servers"].get("")
        if server and server["ready"]:
            elapsed = time.perf_counter() - t0
            break
        time.sleep(0.02)
    hub.stop_server(user)
    return elapsed


def p90(values: list[float]) -> float:
    return statistics.quantiles(values, n=10)[-1]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.spawn", description=__doc__)
    parser.add_argument("--spawns", type=int, default=12, help="spawns per spawner (default 12)")
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
            for i in range(args.spawns):
                times["gpupool"].append(spawn_once(ours, "bench", {"gpus": 0.25}))
                times["baseline"].append(spawn_once(base, "bench", None))
                print(f"\rspawn {i + 1}/{args.spawns}", end="", file=sys.stderr, flush=True)
            print(file=sys.stderr)
        finally:
            ours.stop()
            base.stop()
    med = {k: statistics.median(v) for k, v in times.items()}
    tail = {k: p90(v) for k, v in times.items()}
    print(f"spawn-to-ready over {args.spawns} spawns each (seconds)")
    print("| spawner | median | p90 |")
    print("|---|---|---|")
    print(f"| SimpleLocalProcessSpawner (baseline) | {med['baseline']:.2f} | {tail['baseline']:.2f} |")
    print(f"| gpupool GPUSimpleLocalProcessSpawner | {med['gpupool']:.2f} | {tail['gpupool']:.2f} |")
    print(
        f"| ratio gpupool / baseline | {med['gpupool'] / med['baseline']:.3f} |"
        f" {tail['gpupool'] / tail['baseline']:.3f} |"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
