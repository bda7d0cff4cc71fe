"""The culler's pass cost on a class-sized real hub: N users with running GPU workspaces (page
limit 200), their servers one shared HTTP responder (tests/support/shared_server.py); the hub,
the proxy, the gpupool API and the culler are real. Sequential (concurrency 1) and concurrent
reads and stops are measured in the same run, on the same hub.

Used by `tests/test_culler_class_size.py` (which asserts what it finds) and by
`python -m benchmarks.culling --class-size 500` (which prints the table).
"""

from __future__ import annotations

import http.server
import json
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from gpupool.idle_culler.config import IdleCuller
from gpupool.idle_culler.sampler import FileSampler
from gpupool.idle_culler.service import Client, Culler, service_definition

from tests.hubtools import REPO, Hub

TOKEN = "test-culler-token-0123456789abcdef"


def config(users: int) -> str:
    _, role = service_definition("test-culler", "", {})
    return f"""
c.JupyterHub.services.append({{"name": "test-culler", "api_token": "{TOKEN}"}})
c.JupyterHub.load_roles.append({json.dumps({**role, "name": "test-culler", "services": ["test-culler"]})})
c.GPUPool.virtual_gpus = {max(1, users // 10)}
c.GPUPool.allowed_fractions = [0.1]
c.GPUPool.build_placement_policy = "first-fit"
c.JupyterHub.concurrent_spawn_limit = 0
c.JupyterHub.init_spawners_timeout = 1
"""


class _Ok(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802 - the stdlib's name
        self.send_response(200)
        self.end_headers()

    def log_message(self, *args) -> None:
        pass


def measure(hub_for: object, samples: Path, users: int = 500, concurrency: int = 10, stops: int = 0) -> dict:
    """Start a hub with `hub_for(extra_config, env=...)` (a Hub factory), fill it with `users`
    running workspaces and time the culler on it: reads, a pass that judges all, and passes that
    stop `stops` of them (all by default), half one at a time, half `concurrency` at once.
    Returns the figures and what each pass saw."""
    responder = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Ok)
    threading.Thread(target=responder.serve_forever, daemon=True).start()
    try:
        hub: Hub = hub_for(config(users), env={
            "GPUPOOL_CULLER": "0", "GPUPOOL_SPAWNER": "tests.support.shared_server.SharedServerGPUSpawner",
            "GPUPOOL_TEST_RESPONDER_PORT": str(responder.server_address[1]), "PYTHONPATH": str(REPO),
        }).start()
        names = [f"student{i:03d}" for i in range(users)]

        def spawn(user: str) -> None:
            hub.api("POST", f"/hub/api/users/{user}")
            hub.api("POST", f"/hub/api/users/{user}/server", {"gpus": 0.1})

        with ThreadPoolExecutor(8) as pool:  # bounded, like a class logging in
            list(pool.map(spawn, names))
        deadline = time.monotonic() + 300
        while len(hub.allocations()) < users:
            if time.monotonic() > deadline:
                raise RuntimeError(f"only {len(hub.allocations())} of {users} workspaces started:\n{hub.tail()}")
            time.sleep(1)

        def culler(util: float, conc: int, exempt: list[str] = (), clock_s: float = 0.0) -> Culler:
            samples.write_text(json.dumps({f"{u}/": {"util_pct": util} for u in names}))
            return Culler(IdleCuller(sampler="file", concurrency=conc, exempt_users=list(exempt)), Client(TOKEN),
                          f"{hub.url}/hub/api", f"http://127.0.0.1:{hub.api_port}/services/gpupool/",
                          FileSampler(str(samples)), clock=lambda: time.time() + clock_s)

        out: dict = {"users": users, "concurrency": concurrency}
        t = time.perf_counter()
        out["unpaged_seen"] = len(Client(TOKEN).call("GET", f"{hub.url}/hub/api/users?state=active"))
        out["unpaged_s"] = time.perf_counter() - t
        for label, conc in (("sequential", 1), ("concurrent", concurrency)):
            c = culler(50, conc)
            t = time.perf_counter()
            out[f"read_{label}_seen"] = len(c.servers())
            out[f"read_{label}_s"] = time.perf_counter() - t
        t = time.perf_counter()
        out["judged"] = sorted(w["owner"] for w in culler(50, concurrency).run_pass()["workspaces"])
        out["judge_s"] = time.perf_counter() - t
        # two days on, GPUs idle: past the 12 h max age, every workspace is stopped; half of the
        # class with one request at a time, the other half `concurrency` at once (the first half
        # is exempt from the second pass and the other way round)
        stops = stops or users
        half = stops // 2
        first, second = names[:half], names[half:stops]
        for label, conc, mine in (("sequential", 1, first), ("concurrent", concurrency, second)):
            others = [n for n in names if n not in set(mine)]
            t = time.perf_counter()
            result = culler(0, conc, exempt=others, clock_s=2 * 86400).run_pass()
            out[f"stop_{label}_s"] = time.perf_counter() - t
            out[f"stop_{label}_culled"] = sorted(e["owner"] for e in result["events"] if e["kind"] == "cull")
            out[f"stop_{label}_expected"] = sorted(mine)
        deadline = time.monotonic() + 120
        while len(hub.allocations()) > users - stops and time.monotonic() < deadline:
            time.sleep(0.5)
        out["stops"], out["left_running"] = stops, len(hub.allocations())
        return out
    finally:
        responder.shutdown()


def table(f: dict) -> str:
    n, half, c = f["users"], f["stops"] // 2, f["concurrency"]
    return "\n".join([
        f"| {n} workspaces, real hub (page limit 200) | time | seen / stopped |",
        "|---|---|---|",
        f"| one unpaginated `GET /users?state=active` (before paging) | {f['unpaged_s']:.2f} s |"
        f" {f['unpaged_seen']} seen |",
        f"| paged read, one page at a time | {f['read_sequential_s']:.2f} s | {f['read_sequential_seen']} seen |",
        f"| paged read, {c} pages at once | {f['read_concurrent_s']:.2f} s | {f['read_concurrent_seen']} seen |",
        f"| whole pass, all busy (nothing to stop) | {f['judge_s']:.2f} s | {len(f['judged'])} judged |",
        f"| pass stopping {half}, one stop at a time (concurrency 1) | {f['stop_sequential_s']:.2f} s |"
        f" {len(f['stop_sequential_culled'])} stopped |",
        f"| pass stopping {f['stops'] - half}, {c} stops at once (concurrency {c}) | {f['stop_concurrent_s']:.2f} s |"
        f" {len(f['stop_concurrent_culled'])} stopped |",
    ])
