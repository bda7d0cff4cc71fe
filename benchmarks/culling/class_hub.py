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
import statistics
import threading
import time
from pathlib import Path

from gpupool.idle_culler.config import IdleCuller
from gpupool.idle_culler.sampler import FileSampler
from gpupool.idle_culler.service import Client, Culler, service_definition
from tests.hubtools import ADMIN_TOKEN, REPO, Hub

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
# JupyterHub's own defaults, not the test harness's fast ones (a poll of every server each
# second, the proxy's routes read every 5 s): a class-sized hub runs with these
c.Spawner.poll_interval = 30
c.JupyterHub.last_activity_interval = 300
"""


class _Ok(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802 - the stdlib's name
        self.send_response(200)
        self.end_headers()

    def log_message(self, *args) -> None:
        pass


class _Responder(http.server.ThreadingHTTPServer):
    # socketserver's listen backlog is 5: a restarted hub checks every server at once, and the
    # connections past the backlog wait for the kernel's SYN retransmits (1, 3, 7, 15 s ...): a
    # class's check then took half a minute of waiting that is neither the hub's nor the culler's
    request_queue_size = 1024


def populate(state: Path, users: list[str], port: int) -> None:
    """Write `users` with a running 0.1-GPU workspace each into a stopped hub's databases, as
    a hub restarted during a class finds them (JupyterHub then checks every server, re-adds its
    route and gpupool re-adopts its share): what a class's morning of spawns leaves, without
    the hours of spawning a small machine needs for it (about one spawn per second here)."""
    import datetime as dt

    from jupyterhub import orm

    from gpupool.store import Allocation, Store

    now = dt.datetime.now(dt.UTC).replace(tzinfo=None)
    db = orm.new_session_factory(f"sqlite:///{state / 'jupyterhub.sqlite'}")()
    role = orm.Role.find(db, "user")  # what the hub gives every user it makes (its first start made it)
    for name in users:
        user = orm.User(name=name, created=now, last_activity=now, roles=[role])
        server = orm.Server(ip="127.0.0.1", port=port, base_url=f"/user/{name}/")
        db.add_all(
            [
                user,
                server,
                orm.Spawner(
                    user=user,
                    name="",
                    server=server,
                    state={"running": True},
                    started=now,
                    last_activity=now,
                    user_options={"gpus": 0.1},
                ),
            ]
        )
    db.commit()
    db.close()
    store = Store(f"sqlite:///{state / 'gpupool.sqlite'}")
    with store.session() as s:  # first fit: ten 0.1 shares per virtual GPU, as the spawns placed them
        s.add_all(
            Allocation(
                kind="build",
                owner=name,
                name="",
                node="localhost",
                gpus=[i // 10],
                gpu_milli=100,
                groups=[],
                state="running",
                created=now,
            )
            for i, name in enumerate(users)
        )
    store.engine.dispose()


def ready_count(hub: Hub) -> int:
    return len(Client(ADMIN_TOKEN).paginated(f"{hub.url}/hub/api/users?state=ready", 10))


def measure(
    hub_for: object,
    samples: Path,
    users: int = 500,
    concurrency: int = 10,
    stops: int = 0,
    one_at_a_time: int = -1,
    probe: bool = True,
    quiet_s: float = 5.0,
) -> dict:
    """Start a hub with `hub_for(extra_config, env=...)` (a Hub factory) holding `users` running
    workspaces (populate) and time the culler on it: reads, a pass that judges all (beside the
    bare reads it needs), and passes that stop `stops` of them at the end of the workday (all
    by default): `one_at_a_time` of them one request at a time (default half), the others
    `concurrency` at once. With `probe`, other users' API calls are timed while the stops run,
    beside the same calls on the quiet hub (for at least `quiet_s`). Returns the figures and
    what each pass saw."""
    responder = _Responder(("127.0.0.1", 0), _Ok)
    threading.Thread(target=responder.serve_forever, daemon=True).start()
    try:
        hub: Hub = hub_for(
            config(users),
            env={
                "GPUPOOL_CULLER": "0",
                "GPUPOOL_SPAWNER": "tests.support.shared_server.SharedServerGPUSpawner",
                "GPUPOOL_TEST_RESPONDER_PORT": str(responder.server_address[1]),
                "PYTHONPATH": str(REPO),
            },
        )
        names = [f"student{i:04d}" for i in range(users)]
        hub.start()  # makes the databases
        hub.stop()
        populate(hub.state, names, responder.server_address[1])
        hub.start(timeout=600)
        deadline = time.monotonic() + 900
        while (ready := ready_count(hub)) < users:
            if time.monotonic() > deadline:
                raise RuntimeError(f"only {ready} of {users} workspaces ready:\n{hub.tail()}")
            time.sleep(0.5)

        def culler(util: float, conc: int, exempt: list[str] = (), clock_s: float = 0.0) -> Culler:
            samples.write_text(json.dumps({f"{u}/": {"util_pct": util} for u in names}))
            # the end of the workday: sessions end at 18:00, two days on every one is past it
            cfg = IdleCuller(
                sampler="file",
                concurrency=conc,
                exempt_users=list(exempt),
                workday_end="18:00",
                busy_grace_s=0,
            )
            return Culler(
                cfg,
                Client(TOKEN),
                f"{hub.url}/hub/api",
                f"http://127.0.0.1:{hub.api_port}/services/gpupool/",
                FileSampler(str(samples)),
                clock=lambda: time.time() + clock_s,
            )

        out: dict = {"users": users, "concurrency": concurrency}
        t = time.perf_counter()
        out["unpaged_seen"] = len(Client(TOKEN).call("GET", f"{hub.url}/hub/api/users?state=active"))
        out["unpaged_s"] = time.perf_counter() - t
        for label, conc in (("sequential", 1), ("concurrent", concurrency)):
            c = culler(50, conc)
            t = time.perf_counter()
            out[f"read_{label}_seen"] = len(c.servers())
            out[f"read_{label}_s"] = time.perf_counter() - t
        # the floor of a pass: the reads it needs, nothing judged, nothing reported
        c = culler(50, concurrency)
        t = time.perf_counter()
        c.servers()
        c.client.call("GET", c.gpupool + "api/culler/targets")
        out["bare_reads_s"] = time.perf_counter() - t
        t = time.perf_counter()
        out["judged"] = sorted(w["owner"] for w in culler(50, concurrency).run_pass()["workspaces"])
        out["judge_s"] = time.perf_counter() - t
        stops = stops or users
        if one_at_a_time < 0:
            one_at_a_time = stops // 2
        first, second = names[:one_at_a_time], names[one_at_a_time:stops]
        others = names[stops:] or names[:1]  # users who keep working while the class is stopped
        prober = Prober(hub, others[-3:]) if probe else None
        if prober is not None:
            out["probe_quiet"] = prober.run_for(max(quiet_s, min(30.0, out["judge_s"] * 2)))
        for label, conc, mine in (("sequential", 1, first), ("concurrent", concurrency, second)):
            if not mine:
                continue
            exempt = [n for n in names if n not in set(mine)]
            c = culler(0, conc, exempt=exempt, clock_s=2 * 86400)
            if prober is not None and label == "concurrent":
                prober.start()
            t = time.perf_counter()
            result = c.run_pass()
            out[f"stop_{label}_s"] = time.perf_counter() - t
            if prober is not None and label == "concurrent":
                out["probe_stopping"] = prober.stop()
            out[f"stop_{label}_culled"] = sorted(e["owner"] for e in result["events"] if e["kind"] == "cull")
            out[f"stop_{label}_expected"] = sorted(mine)
            out[f"stop_{label}_n"] = len(mine)
        deadline = time.monotonic() + 300
        while len(hub.allocations()) > users - stops and time.monotonic() < deadline:
            time.sleep(0.5)
        out["stops"], out["left_running"] = stops, len(hub.allocations())
        return out
    finally:
        responder.shutdown()


class Prober:
    """Other users at work: each asks the hub's REST API for its own model and the gpupool API
    for its culler status (what a JupyterLab status item polls), one call after another."""

    def __init__(self, hub: Hub, users: list[str]) -> None:
        self.hub = hub
        self.calls = [
            (path, hub.user_token(u))
            for u in users
            for path in ("/hub/api/user", "/services/gpupool/api/culler/status")
        ]
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.times: list[float] = []
        self.errors = 0
        self.failures: list[str] = []

    def _loop(self) -> None:
        i = 0
        while not self._stop.is_set():
            path, token = self.calls[i % len(self.calls)]
            i += 1
            t = time.perf_counter()
            try:
                self.hub.api("GET", path, token=token, timeout=60)
            except OSError as err:
                self.errors += 1
                if len(self.failures) < 5:
                    self.failures.append(f"GET {path}: {err}")
            self.times.append(time.perf_counter() - t)
            self._stop.wait(0.05)

    def start(self) -> None:
        self._stop.clear()
        self.times, self.errors, self.failures = [], 0, []
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()

    def stop(self) -> dict:
        self._stop.set()
        assert self._thread is not None
        self._thread.join(120)
        return {
            "n": len(self.times),
            "p50": pct(self.times, 50),
            "p99": pct(self.times, 99),
            "errors": self.errors,
            "failures": list(self.failures),
        }

    def run_for(self, seconds: float) -> dict:
        self.start()
        time.sleep(seconds)
        return self.stop()


def pct(values: list[float], q: int) -> float:
    if len(values) < 2:
        return values[0] if values else float("nan")
    return statistics.quantiles(values, n=100)[q - 1]


PASS_TARGET_S = 20.0  # one pass over a class with nothing to stop (issue #26: 5,000 workspaces)
API_TARGET_S = 1.0  # other users' API p99 while a class is stopped


def table(f: dict) -> str:
    n, c = f["users"], f["concurrency"]
    lines = [
        f"| {n} workspaces, real hub | time | seen / stopped |",
        "|---|---|---|",
        f"| one unpaginated `GET /users?state=active` (before paging) | {f['unpaged_s']:.2f} s |"
        f" {f['unpaged_seen']} seen |",
        f"| paged read, one page at a time | {f['read_sequential_s']:.2f} s | {f['read_sequential_seen']} seen |",
        f"| paged read, {c} pages at once | {f['read_concurrent_s']:.2f} s | {f['read_concurrent_seen']} seen |",
        f"| bare reads a pass needs (paged users + targets), baseline | {f['bare_reads_s']:.2f} s | |",
        f"| whole pass, all busy (nothing to stop) | {f['judge_s']:.2f} s | {len(f['judged'])} judged |",
    ]
    if "stop_sequential_s" in f:
        lines.append(
            f"| pass stopping {f['stop_sequential_n']}, one stop at a time (concurrency 1) |"
            f" {f['stop_sequential_s']:.2f} s | {len(f['stop_sequential_culled'])} stopped |"
        )
    if "stop_concurrent_s" in f:
        lines.append(
            f"| pass stopping {f['stop_concurrent_n']}, {c} stops at once (concurrency {c}) |"
            f" {f['stop_concurrent_s']:.2f} s | {len(f['stop_concurrent_culled'])} stopped |"
        )
    for key, label in (
        ("probe_quiet", "other users' API calls, quiet hub (baseline)"),
        ("probe_stopping", "other users' API calls while the pass stops the class"),
    ):
        if key in f:
            p = f[key]
            lines.append(
                f"| {label}: p50 / p99 | {p['p50']:.3f} / {p['p99']:.3f} s | {p['n']} calls,"
                f" {p['errors']} failed |"
            )
    return "\n".join(lines)


def verdict(f: dict) -> str:
    """One line: each figure beside its baseline as a ratio, and whether its target is met."""
    parts = [
        f"pass over {f['users']}: {f['judge_s']:.1f} s = {f['judge_s'] / f['bare_reads_s']:.1f}x the bare reads"
        f" (target <= {PASS_TARGET_S:.0f} s: {'met' if f['judge_s'] <= PASS_TARGET_S else 'NOT met'})"
    ]
    if "probe_stopping" in f:
        quiet, busy = f["probe_quiet"], f["probe_stopping"]
        ok = busy["p99"] <= API_TARGET_S and not busy["errors"]
        parts.append(
            f"other users' API p99 while stopping {f['stop_concurrent_n']}: {busy['p99']:.2f} s ="
            f" {busy['p99'] / quiet['p99']:.1f}x the quiet hub's {quiet['p99']:.2f} s"
            f" (target <= {API_TARGET_S:.0f} s: {'met' if ok else 'NOT met'})"
        )
    return "class size: " + "; ".join(parts)
