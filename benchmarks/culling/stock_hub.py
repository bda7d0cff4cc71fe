"""The culling replay's world "stock idle-culler + gpupool arbiter": the decisions are made by
jupyterhub-idle-culler's own loop (`jupyterhub_idle_culler.cull_idle`, its real HTTP requests)
with `gpupool.idle_culler.stock_arbiter.GPUArbiter` as its `cull_arbiter_hook`, against a small
in-process hub API that serves, at each pass, the replay's running servers.

Time is travelled, never slept: idle-culler reads its clock through its module's `utcnow` and the
arbiter through its `clock`; both read the world's. GPU use reaches the arbiter through its sampler
seam (what the node agents would answer at the pass: the session's GPU busy or idle at that
instant, by pod uid), the pod's uid through its `pod_uid` seam (what the Kubernetes API answers for
kubespawner's pod name: the uid of the pod running now). As kubespawner names a user's pod the same
at every start (`jupyter-<user>`), a server started again keeps its pod name and gets a new uid.

Sessions are those of benchmarks.culling (sessions.py), all opening on one day at their time of day
(they do not interact: the figures are per session, only the hub's list grows). What a session
counts follows the replay's `replay` (benchmarks/culling/__main__.py): a culled user comes back at
their next cell with a new server; a cull is false when a cell starts within 30 minutes after it,
a lost kernel state when any cell starts after it, a running cell stopped when a cell runs at
it. GPU time used is the cells' time while held (exact, not per minute); reserved, the time held.
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import datetime as dt
import json
import logging
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from benchmarks.culling.sessions import DAY, WORK_END, Session, at_work

EPOCH = 1_780_272_000.0  # a midnight (UTC), as the replay's: sessions open at their time of day after it
FALSE_WINDOW = 30 * 60  # the replay's: a cull the user comes back from within 30 min is false
NAMESPACE = "jhub"


def iso(epoch: float) -> str:
    return dt.datetime.fromtimestamp(epoch, dt.UTC).isoformat().replace("+00:00", "Z")


@dataclass
class Life:
    """One session's servers on the hub, from its opening to the end of its lifetime."""

    s: Session
    name: str
    opened: float  # epoch seconds
    starts: list[float] = field(default_factory=list)
    ends: list[float] = field(default_factory=list)
    held_from: float | None = 0.0  # seconds into the session; None: culled, waiting for the next cell
    culled_at: float = 0.0
    incarnation: int = 0  # the server's start count: its pod's uid changes with it
    done: bool = False
    reserved: float = 0.0
    used: float = 0.0
    culls: int = 0
    false: int = 0
    returned: int = 0
    killed: int = 0

    def __post_init__(self) -> None:
        self.starts = [a for a, _ in self.s.cells]
        self.ends = [b for _, b in self.s.cells]

    @property
    def pod(self) -> str:
        return f"jupyter-{self.name}"  # kubespawner's default pod name: the same at every start

    @property
    def uid(self) -> str:
        return f"{self.name}-{self.incarnation}"

    def busy(self, t: float) -> bool:
        i = bisect.bisect_right(self.starts, t) - 1
        return i >= 0 and t < self.ends[i]

    def cell_after(self, t: float) -> float | None:
        i = bisect.bisect_right(self.starts, t)
        return self.starts[i] if i < len(self.starts) else None

    def close(self, until: float) -> None:
        """The server held from held_from until `until` (a cull or the end of the lifetime)."""
        assert self.held_from is not None
        h = self.held_from
        self.reserved += (until - h) * self.s.gpus
        self.used += sum(max(0.0, min(b, until) - max(a, h)) for a, b in self.s.cells) * self.s.gpus

    def advance(self, t: float) -> None:
        """To `t` seconds into the session: the user comes back, the lifetime ends."""
        if self.done or t < 0:
            return
        if self.held_from is None:
            nxt = self.cell_after(self.culled_at)
            if nxt is None or nxt >= self.s.lifetime_s:
                self.done = True
                return
            if nxt > t:
                return
            self.held_from, self.incarnation = nxt, self.incarnation + 1  # a new server, a new pod
        if t >= self.s.lifetime_s:
            self.close(self.s.lifetime_s)
            self.done = True

    def last_activity(self, t: float) -> float:
        """Seconds into the session of the hub's last_activity at `t`: the last moment the user was
        at the notebook (sessions.Session.user_present), not before the server started."""
        assert self.held_from is not None
        cap = min(t, self.s.active_end)
        tod = self.s.start_tod + cap
        if not at_work(tod):  # gone home: the last activity was the end of the workday before
            day = tod // DAY if tod % DAY >= WORK_END else tod // DAY - 1
            cap = day * DAY + WORK_END - self.s.start_tod
        return max(cap, self.held_from)

    def cull(self, t: float) -> None:
        self.close(t)
        self.culls += 1
        nxt = self.cell_after(t)
        if nxt is not None and nxt <= t + FALSE_WINDOW:
            self.false += 1
        if nxt is not None:
            self.returned += 1  # came back, however much later: the kernel's state is gone
        if self.busy(t):
            self.killed += 1
        self.held_from, self.culled_at = None, t

    def model(self, t: float) -> dict:
        """The user as JupyterHub's REST API lists it, with its running server."""
        assert self.held_from is not None
        active = iso(self.opened + self.last_activity(t))
        server = {
            "name": "",
            "ready": True,
            "pending": None,
            "url": f"/user/{self.name}/",
            "started": iso(self.opened + self.held_from),
            "last_activity": active,
            "state": {"pod_name": self.pod, "namespace": NAMESPACE},  # the admin:server_state scope
        }
        return {
            "kind": "user",
            "name": self.name,
            "admin": False,
            "last_activity": active,
            "servers": {"": server},
        }


class World:
    def __init__(self, sessions: list[Session]) -> None:
        self.lives = [Life(s, f"u{i:05d}", EPOCH + s.start_tod) for i, s in enumerate(sessions)]
        self.by_name = {life.name: life for life in self.lives}
        self.now = EPOCH
        self.passes = 0

    def advance(self, now: float) -> None:
        self.now = now
        for life in self.lives:
            life.advance(now - life.opened)

    def running(self) -> list[Life]:
        return [
            life
            for life in self.lives
            if not life.done and life.held_from is not None and self.now >= life.opened
        ]

    def cull(self, name: str) -> bool:
        life = self.by_name.get(name)
        if life is None or life.done or life.held_from is None:
            return False
        life.cull(self.now - life.opened)
        return True

    def end(self) -> float:
        return max(life.opened + life.s.lifetime_s for life in self.lives)

    # the arbiter's seams: what the Kubernetes API and the node agents would answer now
    async def pod_uid(self, namespace: str, name: str) -> str | None:
        life = self.by_name.get(name.removeprefix("jupyter-"))
        if namespace != NAMESPACE or life is None or life.held_from is None or life.done:
            return None
        return life.uid

    def sample(self, targets: list) -> dict:
        from gpupool.idle_culler.sampler import GPUUse

        live = {life.uid: life for life in self.running()}
        out = {}
        for t in targets:
            life = live.get(t.pod_uid)
            if life is not None:  # an agent reports the pods that run on its node, nothing else
                out[t.key] = GPUUse(100.0 if life.busy(self.now - life.opened) else 0.0, 1000)
        return out

    def figures(self) -> dict:
        reserved = sum(life.reserved for life in self.lives)
        used = sum(life.used for life in self.lives)
        return {
            "reserved_gpu_h": reserved / 3600,
            "used_gpu_h": used / 3600,
            "used_pct": 100 * used / reserved if reserved else 0.0,
            "culls": sum(life.culls for life in self.lives),
            "false_cull_sessions_pct": 100 * sum(1 for life in self.lives if life.false) / len(self.lives),
            "killed": sum(life.killed for life in self.lives),
            "returned": sum(life.returned for life in self.lives),
            "passes": self.passes,
        }


def hub_app(world: World, page: int = 200):
    """What cull_idle asks of JupyterHub 5.5 (z2jh's): the version, the ready users (paginated,
    `page` a page as the hub's default), and a server's stop."""
    from tornado.web import Application, RequestHandler

    class Root(RequestHandler):
        def get(self) -> None:
            self.write({"version": "5.5.0"})

    class Users(RequestHandler):
        def get(self) -> None:
            assert self.get_argument("state", "") == "ready"
            offset = int(self.get_argument("offset", "0"))
            limit = min(page, int(self.get_argument("limit", str(page))))
            running = world.running()
            items = [life.model(world.now - life.opened) for life in running[offset : offset + limit]]
            self.set_header("Content-Type", "application/json")
            if "pagination" not in self.request.headers.get("Accept", ""):
                self.write(json.dumps(items))
                return
            nxt = None
            if offset + limit < len(running):
                url = f"{self.request.protocol}://{self.request.host}/hub/api/users"
                nxt = {
                    "offset": offset + limit,
                    "limit": limit,
                    "url": f"{url}?state=ready&offset={offset + limit}",
                }
            body = {
                "items": items,
                "_pagination": {"offset": offset, "limit": limit, "total": len(running), "next": nxt},
            }
            self.write(json.dumps(body))

    class Server(RequestHandler):
        def delete(self, name: str) -> None:
            self.set_status(204 if world.cull(name) else 400)

    return Application(
        [(r"/hub/api/", Root), (r"/hub/api/users", Users), (r"/hub/api/users/([^/]+)/server", Server)]
    )


@contextlib.contextmanager
def idle_culler_clock(world: World) -> Iterator[None]:
    """idle-culler's `now` is its module's utcnow(), looked up at each pass: the world's clock."""
    import jupyterhub_idle_culler as jic

    real = jic.utcnow
    jic.utcnow = lambda: dt.datetime.fromtimestamp(world.now, dt.UTC)
    try:
        yield
    finally:
        jic.utcnow = real


Hook = Callable[..., Any]


async def run_world(
    sessions: list[Session],
    every: float,
    hook: Callable[[World], Hook] | None,
    inactive_limit: int = 3600,
) -> dict:
    """Replay `sessions` through idle-culler's loop, a pass every `every` seconds of the world's time.
    hook(world): the cull_arbiter_hook (None: idle-culler's own, the stock rule at `inactive_limit`)."""
    import jupyterhub_idle_culler as jic
    from tornado.httpserver import HTTPServer
    from tornado.testing import bind_unused_port

    world = World(sessions)
    sock, port = bind_unused_port()
    server = HTTPServer(hub_app(world))
    server.add_sockets([sock])
    arbiter = hook(world) if hook else jic.default_cull_arbiter
    log = logging.getLogger("benchmarks.culling.stock_hub")
    log.setLevel(logging.WARNING)  # idle-culler logs every cull at INFO
    t0 = time.perf_counter()
    try:
        with idle_culler_clock(world):
            now, end = EPOCH, world.end() + every
            while now <= end:
                world.advance(now)
                if world.running():  # no server: the pass asks the hub and finds nothing to judge
                    await jic.cull_idle(
                        url=f"http://127.0.0.1:{port}/hub/api",
                        api_token="culler",
                        inactive_limit=inactive_limit,
                        logger=log,
                        concurrency=10,  # idle-culler's default
                        cull_arbiter=arbiter,
                    )
                world.passes += 1
                now += every
            world.advance(end)
    finally:
        server.stop()
        sock.close()
    out = world.figures()
    out["seconds"] = time.perf_counter() - t0
    out["world"] = world
    return out


def arbiter_hook(world: World) -> Hook:
    from gpupool.idle_culler.stock_arbiter import GPUArbiter

    return GPUArbiter(sample=world.sample, pod_uid=world.pod_uid, clock=lambda: world.now)


def stock_hub_worlds(sessions: list[Session], every: float) -> tuple[dict, dict]:
    """(arbiter, stock): the same sessions through idle-culler's loop, with gpupool's hook and with
    idle-culler's own rule at z2jh's cull.timeout (1 h)."""
    ours = asyncio.run(run_world(sessions, every, arbiter_hook))
    stock = asyncio.run(run_world(sessions, every, None))
    return ours, stock


def default_every() -> int:
    """idle-culler's own default interval (half its default timeout)."""
    from jupyterhub_idle_culler import IdleCuller

    return IdleCuller().cull_every


def table(rows: list[tuple[str, dict]]) -> str:
    out = [
        "| world | reserved GPU-h | used / reserved | culls | sessions with a false cull (back within 30 min) |"
        " culls the user came back from after any gap (lost kernel states) | culls that killed a running cell |",
        "|---|---|---|---|---|---|---|",
    ]
    for label, r in rows:
        out.append(
            f"| {label} | {r['reserved_gpu_h']:,.0f} | {r['used_pct']:.1f} % | {r['culls']} |"
            f" {r['false_cull_sessions_pct']:.1f} % | {r['returned']} | {r['killed']} |"
        )
    return "\n".join(out)


def verdict(ours: dict, stock: dict, every: float, sessions: str) -> str:
    """The arbiter world's line, with the stock rule through the same loop beside it; the targets are
    gpupool's own culler's (#26, #40)."""
    ok = ours["used_pct"] >= 70 and ours["false_cull_sessions_pct"] <= 1 and ours["killed"] == 0
    return (
        f"VERDICT stock hub: idle-culler {_version()} + gpupool arbiter, a pass every {every:g} s, {sessions}:"
        f" {ours['used_pct']:.1f} % used/reserved, {ours['false_cull_sessions_pct']:.1f} % of sessions falsely"
        f" culled (back within 30 min), {ours['returned']} lost kernel states of {ours['culls']} culls,"
        f" {ours['killed']} running cells stopped; idle-culler's own rule (1 h) through the same loop"
        f" {stock['used_pct']:.1f} %, {stock['false_cull_sessions_pct']:.1f} %, {stock['returned']} lost of"
        f" {stock['culls']}, {stock['killed']} stopped; target >= 70 %, <= 1 %, 0 stopped:"
        f" {'met' if ok else 'NOT met'} ({ours['seconds'] + stock['seconds']:.0f} s)"
    )


def _version() -> str:
    import jupyterhub_idle_culler

    return jupyterhub_idle_culler.__version__
