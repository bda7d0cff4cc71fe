"""The culler's side of the API: what to watch, what it found, and the user's extension.

The culler is a separate process (a hub service); the hub process keeps the one copy of
its findings so notebooks and the hub page can show warnings.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, cast

from tornado import web

from gpupool.api.auth import APIHandler
from gpupool.api.hibernation import parse_saved
from gpupool.api.hibernation import prune as prune_hibernated
from gpupool.api.hibernation import record as record_hibernation
from gpupool.api.page import record_history
from gpupool.api.parking import parked_targets
from gpupool.gpu.memory_cap import share_cap_mib
from gpupool.hub.adapter import hub_user, hub_users
from gpupool.store import Event
from gpupool.store.db import bounded
from gpupool.vocab.culler_wire import CullerStatus, CullTarget, Finding, ReportEvent
from gpupool.vocab.culling import BudgetAction, CullAction, CullReason
from gpupool.vocab.kinds import CULLER_EVENTS, EventKind, WorkloadKind

if TYPE_CHECKING:
    from jupyterhub.spawner import Spawner
    from jupyterhub.user import User

    from gpupool.alloc.manager import PoolManager
    from gpupool.api.services import ApiServices
    from gpupool.hub.adapter import HubApp
    from gpupool.store import Allocation

EXTENSION = "extension:{owner}/{name}"
YIELD_EVERY = 250  # workspaces listed between two turns of the hub's event loop


def session_of(
    app: HubApp | None, owner: str, name: str, row: Allocation | None = None, user: User | None = None
) -> str:
    """The session a one-time extension belongs to: the server's start as the hub records it
    (`started`), the same through hub restarts and GPU parking and new at each start. A share's
    row id would not do: SQLite hands a freed id to the next row, so the session after an extended
    one, or a resumed one, would be taken for it. Without the hub's record (no hub app): the
    share's row, with its creation time. `user`: the hub's User when the caller has it already."""
    user = user if user is not None else hub_user(app, owner)  # not `owner in app.users`: a walk of all
    spawner = user.spawners.get(name) if user is not None else None
    started = getattr(getattr(spawner, "orm_spawner", None), "started", None)
    if started is not None:
        return f"started {started.isoformat()}"
    return f"share {row.id} {row.created.isoformat()}" if row is not None else ""


def extended_in(
    pool: PoolManager,
    app: HubApp | None,
    owner: str,
    name: str,
    row: Allocation | None = None,
    *,
    user: User | None = None,
    extensions: dict[str, Any] | None = None,
) -> bool:
    """Whether this session of the workspace has had its one extension. `extensions`: every
    workspace's, read at once by a caller that lists many (else this one's is read)."""
    key = EXTENSION.format(owner=owner, name=name)
    ext = (extensions.get(key) if extensions is not None else pool.store.get_setting(key)) or {}
    session = session_of(app, owner, name, row, user)
    return bool(session) and ext.get("session") == session


# (owner, groups, admin, profile, started, extended) -> (reason, end) or None: the culler's own
# time rules, handed in by the wiring (gpupool.wiring.setup) when the culler runs
SessionEnd = Callable[[str, Sequence[str], bool, str, float, bool], "tuple[str, float] | None"]


def findings(
    services: ApiServices, pool: PoolManager, hub: HubApp | None = None, owner: str | None = None
) -> dict[str, Finding]:
    """The culler's last findings per "owner/name", and for each GPU workspace it has not judged
    yet (or whose end an extension just moved) the end of its session from its start, by the
    culler's own time rules (services.session_end): known from the spawn on, not only after
    the culler's first pass. The culler's next pass replaces these with what it decides."""
    # the culler's findings, and a planned end where it has none yet (fewer keys, "planned")
    found = {k: Finding(**f) for k, f in services.culler["workspaces"].items()}  # copies: changed below
    session_end = services.session_end
    if session_end is None:  # no culler: no time limit to show
        return found
    # one user's page asks for their own: no map of every user for that
    user_of = hub_users(hub) if owner is None else (lambda name: hub_user(hub, name))
    extensions = pool.store.settings_under(EXTENSION.split("{")[0]) if owner is None else None
    for row in pool.store.allocations(
        kind=WorkloadKind.BUILD, **({"owner": owner} if owner is not None else {})
    ):
        key = f"{row.owner}/{row.name}"
        seen = found.get(key)
        if seen is not None and (seen.get("cull_at") or not seen.get("extended")):
            continue
        user = user_of(row.owner)
        extended = extended_in(pool, hub, row.owner, row.name, row, user=user, extensions=extensions)
        spawner = user.spawners.get(row.name) if user is not None else None
        profile = spawner_profile(spawner)
        started = row.created.replace(tzinfo=dt.UTC).timestamp()
        end = session_end(
            row.owner,
            tuple(row.groups or ()),
            bool(user.admin) if user else False,
            profile,
            started,
            extended,
        )
        if end is None:
            continue
        found[key] = {
            **(seen or unjudged(row.owner, row.name)),
            "reason": end[0],
            "cull_at": end[1],
            "extended": extended,
            "planned": True,
        }
    return found


def unjudged(owner: str, name: str) -> Finding:
    """A workspace no pass has judged yet: kept, no readings (the pages fill in its planned end)."""
    return {
        "owner": owner,
        "name": name,
        "action": CullAction.KEEP,
        "reason": CullReason.NONE,
        "message": "",
        "parked": "",
        "cull_at": None,
        "extended_cull_at": None,
        "gpu_idle_s": None,
        "gpu_util_pct": None,
        "memory_mib": 0,
        "memory_limit_mib": 0,
        "extended": False,
        "gpu_data": False,
    }


def spawner_profile(spawner: Spawner) -> str:
    """The profile a workspace was started with, as its spawner offered it ("" for none): what the
    culler's profile_overrides apply to. Never user_options["profile"], which a user sets freely."""
    chosen = getattr(spawner, "culler_profile", None)
    return str(chosen() or "") if callable(chosen) else ""


class TargetsHandler(APIHandler):
    """Every build workspace with what the culler needs to judge it."""

    @web.authenticated
    async def get(self) -> None:
        caller = self.caller
        if not caller.sees_all:
            raise web.HTTPError(403, "only the culler service and admins may list workspaces")
        pool = self.pool
        out: list[CullTarget] = []
        app = self.directory.hub
        user_of = hub_users(app)
        extensions = pool.store.settings_under(EXTENSION.split("{")[0])  # one read, not one per workspace
        for n, row in enumerate(pool.store.allocations(kind=WorkloadKind.BUILD)):
            if n and not n % YIELD_EVERY:
                await asyncio.sleep(0)  # a class of thousands: other users' requests go in between
            node = pool.inventory.node(row.node)
            gpus = [node.gpus[i] for i in row.gpus]
            user = user_of(row.owner)
            spawner = user.spawners.get(row.name) if user is not None else None
            out.append(
                {
                    "owner": row.owner,
                    "name": row.name,
                    "pid": row.pid,
                    "pod_uid": spawner.pod_uid()
                    if spawner is not None and hasattr(spawner, "pod_uid")
                    else "",
                    # where the culler reaches the server itself (to restart kernels)
                    "server_url": spawner.server.url
                    if spawner is not None and spawner.server is not None
                    else "",
                    "gpu_uuids": [g.uuid for g in gpus],
                    "whole_gpus": row.gpu_milli >= 1000,
                    "milli": row.total_milli,
                    # what NVML may show its processes use: the share's cap with its CUDA context
                    "memory_limit_mib": sum(
                        share_cap_mib(row.gpu_milli, g.memory_mib, g.reserved_mib, context_mib=0)
                        for g in gpus
                    ),
                    "groups": row.groups or [],
                    "admin": bool(user.admin) if user else False,
                    "profile": spawner_profile(spawner),
                    "extended": extended_in(
                        pool, app, row.owner, row.name, row, user=user, extensions=extensions
                    ),
                    "started": row.created.isoformat() + "Z",
                    # over a GPU-hour budget: what to do once its GPU idles ("park", "stop" or "")
                    "budget": budget_action(self.services, row.owner, tuple(row.groups or ())),
                }
            )
        self.write_json({"workspaces": out + parked_targets(pool, app)})


def budget_action(services: ApiServices, owner: str, groups: tuple[str, ...]) -> BudgetAction:
    usage = services.usage
    return usage.culler_action(owner, groups) if usage is not None else BudgetAction.NONE


class ReportHandler(APIHandler):
    """The culler posts each pass: per-workspace status, and warnings/culls as events."""

    max_body = 4 * 1024 * 1024

    @web.authenticated
    async def post(self) -> None:
        caller = self.caller
        if not caller.reads_servers:
            raise web.HTTPError(403, "only the culler service reports")
        body = self.json_body()
        try:
            pass_time, workspaces, events = parse_report(body, time.time())
        except ValueError as err:  # checked whole before anything is kept
            raise web.HTTPError(400, str(err)) from None
        state = self.services.culler
        state["workspaces"] = {f"{w['owner']}/{w['name']}": w for w in workspaces}
        state["pass_time"] = pass_time
        record_history(self.services.history, self.pool, workspaces, pass_time)
        # the writes in a worker thread, the events in one transaction: a pass that stops a class
        # at the end of the workday reports a thousand culls, which must not hold the hub's loop
        await asyncio.to_thread(self._write, workspaces, pass_time, events)
        self.write_json({"ok": True})

    def _write(self, workspaces: list[Finding], pass_time: float, events: list[ReportEvent]) -> None:
        if self.services.usage is not None:  # GPU use samples for usage accounting
            self.services.usage.record_report(workspaces, pass_time)
        if events:
            with self.pool.store.session() as s:
                s.add_all(
                    Event(
                        kind=e["kind"],
                        message=bounded(e["message"]),
                        owner=e["owner"],
                        name=e["name"],
                        data={
                            "reason": e["reason"],
                            **({"bytes": e["hibernated"]["bytes"]} if "hibernated" in e else {}),
                            **({"idle_s": e["idle_s"]} if "idle_s" in e else {}),
                        },
                    )
                    for e in events
                )
        keep_days = self.services.hibernate_keep_days
        prune_hibernated(self.pool.store, keep_days, pass_time)  # retention has deleted their states
        for e in events:
            if "hibernated" in e:  # the admin's list of hibernated sessions, with the size the save reported
                record_hibernation(
                    self.pool.store, e["owner"], e["name"], e["hibernated"], "culler", pass_time
                )


EVENT_KINDS = CULLER_EVENTS
MAX_IDLE_S = 10**9  # an event's idle time: decades, far over any session
MAX_REPORTED = 100_000  # workspaces (and events) in one pass: far over any hub, under the body limit
# a workspace's findings as the culler sends them: key -> (types, may be null)
FINDINGS: dict[str, tuple[tuple[type, ...], bool]] = {
    "action": ((str,), False),
    "reason": ((str,), False),
    "message": ((str,), False),
    "parked": ((str,), False),
    "cull_at": ((int, float), True),
    "extended_cull_at": ((int, float), True),
    "gpu_idle_s": ((int, float), True),
    "gpu_util_pct": ((int, float), True),
    "memory_mib": ((int, float), False),
    "memory_limit_mib": ((int, float), False),
    "extended": ((bool,), False),
    "gpu_data": ((bool,), False),
}


KINDS: dict[tuple[type, ...], str] = {
    (str,): "text",
    (int, float): "a number (below 1e15)",
    (bool,): "true or false",
}
ACTIONS = tuple(CullAction)  # the culler policy's decisions
# what the pages and widgets read of each finding, whole even when the report left a key out
DEFAULTS: dict[str, object] = {k: v for k, v in unjudged("", "").items() if k not in ("owner", "name")}


def parse_report(body: dict[str, Any], now: float) -> tuple[float, list[Finding], list[ReportEvent]]:
    """A culler pass's report, checked: (pass time, workspaces, events). ValueError says what is
    wrong; unknown keys are dropped, text is cut to the lengths the pages show."""
    pass_time = body.get("pass_time", now)
    if not _number(pass_time) or not 0 <= pass_time <= 10**11:
        raise ValueError("pass_time must be a time in seconds since 1970")
    workspaces = _items(body, "workspaces")
    for i, w in enumerate(workspaces):
        _names(w, f"workspaces[{i}]")
        for key, (types, nullable) in FINDINGS.items():
            if key not in w or _fits(w[key], types, nullable):
                continue
            raise ValueError(f"workspaces[{i}].{key} must be {KINDS[types]}{' or null' if nullable else ''}")
        if w.get("action", CullAction.KEEP) not in ACTIONS:
            raise ValueError(f"workspaces[{i}].action must be one of {', '.join(ACTIONS)}")
    events = _items(body, "events")
    for i, e in enumerate(events):
        _names(e, f"events[{i}]")
        if e.get("kind") not in EVENT_KINDS:
            raise ValueError(f"events[{i}].kind must be one of {', '.join(EVENT_KINDS)}")
        for key in ("message", "reason"):
            if not isinstance(e.get(key, ""), str):
                raise ValueError(f"events[{i}].{key} must be text")
        if "idle_s" in e and not (_number(e["idle_s"]) and 0 <= e["idle_s"] <= MAX_IDLE_S):
            raise ValueError(f"events[{i}].idle_s must be seconds (0 to {MAX_IDLE_S})")
        if "hibernated" in e:  # what the server's save reported (gpupool.api.hibernation)
            if e.get("kind") != EventKind.CULL:
                raise ValueError(f"events[{i}].hibernated: only a cull hibernates")
            try:
                e["hibernated"] = parse_saved(e["hibernated"])
            except ValueError as err:
                raise ValueError(f"events[{i}].{err}") from None
    return (
        float(pass_time),
        [  # checked above, key by key: typed from here on
            cast(
                Finding,
                {
                    "owner": w["owner"],
                    "name": w["name"],
                    **{k: _cut(w[k]) if k in w else default for k, default in DEFAULTS.items()},
                },
            )
            for w in workspaces
        ],
        [
            cast(
                ReportEvent,
                {
                    "kind": EventKind(e["kind"]),
                    "owner": e["owner"],
                    "name": e["name"],
                    "message": _cut(e.get("message", "")),
                    "reason": _cut(e.get("reason", ""), 200),
                    **({"hibernated": e["hibernated"]} if "hibernated" in e else {}),
                    **({"idle_s": int(e["idle_s"])} if "idle_s" in e else {}),
                },
            )
            for e in events
        ],
    )


def _fits(value: object, types: tuple[type, ...], nullable: bool) -> bool:
    if value is None:
        return nullable
    if isinstance(value, bool):  # JSON true is not a number here
        return bool in types
    if isinstance(value, float) and not (value == value and abs(value) < 1e15):
        return False
    return isinstance(value, types)


def _number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and value == value


def _items(body: dict[str, Any], key: str) -> list[dict[str, Any]]:
    items = body.get(key, [])
    if (
        not isinstance(items, list)
        or len(items) > MAX_REPORTED
        or not all(isinstance(x, dict) for x in items)
    ):
        raise ValueError(f"{key} must be a list of at most {MAX_REPORTED} objects")
    return items


def _names(item: dict[str, object], where: str) -> None:
    owner, name = item.get("owner"), item.get("name", "")
    if not isinstance(owner, str) or not 1 <= len(owner) <= 255:
        raise ValueError(f"{where}.owner must be a user name (1 to 255 characters)")
    if not isinstance(name, str) or len(name) > 255:
        raise ValueError(f"{where}.name must be a server name (at most 255 characters; '' for the default)")
    item.setdefault("name", "")


def _cut(value: object, limit: int = 2000) -> object:
    return value[:limit] if isinstance(value, str) else value


class StatusHandler(APIHandler):
    """What the culler last found: users see their own workspaces, admins all."""

    @web.authenticated
    def get(self) -> None:
        caller = self.caller
        state = self.services.culler
        found = findings(
            self.services, self.pool, self.directory.hub, None if caller.sees_all else caller.name
        )
        items = [w for w in found.values() if caller.sees_all or w["owner"] == caller.name]
        answer: CullerStatus = {"pass_time": state["pass_time"], "workspaces": items}
        self.write_json(answer)


def extend_workspace(
    services: ApiServices, pool: PoolManager, by: str, owner: str, name: str, app: HubApp | None = None
) -> None:
    """Grant a workspace's one extension (404: no such GPU workspace, 409: already extended);
    the culler's last findings say so at once, so its warning disappears from the pages."""
    rows = pool.store.allocations(kind=WorkloadKind.BUILD, owner=owner, name=name)
    parked = any(p.owner == owner and p.name == name for p in pool.parked_without_gpu())
    if not rows and not parked:
        raise web.HTTPError(404, f"no running GPU workspace {name or 'default'!r} of {owner}")
    row = rows[0] if rows else None
    if extended_in(pool, app, owner, name, row):
        raise web.HTTPError(409, "this session was already extended once; save your work")
    key = EXTENSION.format(owner=owner, name=name)
    pool.store.put_setting(key, {"session": session_of(app, owner, name, row), "at": time.time()})
    pool.store.record(EventKind.EXTEND, f"{by} extended {owner}/{name or 'default'}", owner=owner, name=name)
    found = services.culler["workspaces"].get(f"{owner}/{name}")
    if found is not None and found.get("reason") != CullReason.MEMORY:
        # the old end time no longer holds, warned or not: the new one is the end the culler's
        # last pass computed for this session extended (its rules, its readings), so the status
        # bar and the home page say the truth at once; a planned end (no pass yet, or a culler
        # that did not say) is computed again from the time rules (findings); no page offers
        # Extend again
        found["extended"], found["cull_at"] = True, found.get("extended_cull_at")
        found["extended_cull_at"] = None
        if found.get("action") == CullAction.WARN:
            found["action"], found["message"] = CullAction.KEEP, "extended once"


class ExtendHandler(APIHandler):
    """A user extends one of their workspaces, once per session."""

    @web.authenticated
    def post(self) -> None:
        caller = self.caller
        body = self.json_body()
        name = body.get("server", "")
        if not isinstance(name, str) or len(name) > 255:
            raise web.HTTPError(400, "server must be a server name ('' for the default server)")
        owner = body.get("owner", caller.name) if caller.admin else caller.name
        if not isinstance(owner, str) or not 1 <= len(owner) <= 255:
            raise web.HTTPError(400, "owner must be a user name")
        extend_workspace(self.services, self.pool, caller.name, owner, name, self.directory.hub)
        self.write_json({"extended": True})
