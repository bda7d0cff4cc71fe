"""The culler's warnings, the GPU shares of one user and why a server of theirs was stopped, for
JupyterHub's home page (template variables)."""

from __future__ import annotations

import datetime as dt
import time
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

from gpupool.api.culler import findings
from gpupool.api.hibernation import available
from gpupool.pool import format_gpus
from gpupool.vocab.culling import CullAction, CullReason
from gpupool.vocab.hibernate_wire import RetentionWarning
from gpupool.vocab.kinds import EventKind, WorkloadKind
from gpupool.vocab.reason_words import STOPPED

if TYPE_CHECKING:
    from jupyterhub.user import User

    from gpupool.api.auth import ApiRoot
    from gpupool.api.services import ApiServices


def warnings_for(root: ApiRoot, user: User | None, base_url: str = "") -> list[dict[str, Any]]:
    """The workspaces of `user` the culler's last pass warned about, with the link that
    extends one (when it may still be extended; memory warnings cannot be)."""
    if user is None or root.api_services is None:
        return []
    out = []
    for w in root.api_services.culler["workspaces"].values():
        if w.get("owner") != user.name or w.get("action") != CullAction.WARN:
            continue
        can_extend = not w.get("extended") and w.get("reason") != CullReason.MEMORY
        link = f"{base_url}/services/gpupool/culler/extend?server={quote(w.get('name', ''))}"
        out.append({**w, "extend_url": link if can_extend else ""})
    return sorted(out, key=lambda w: w.get("name", ""))


def hibernate_url(user: User, name: str, base_url: str = "") -> str:
    """The "Hibernate now" page of a user's server (gpupool.widgets.labserver.HibernateNowPage):
    served by the server itself, so the hub needs no access to it."""
    spawner = getattr(user, "spawners", {}).get(name)
    server = getattr(spawner, "server", None)
    prefix = getattr(server, "base_url", "") or (
        f"{base_url}/user/{quote(user.name)}/" + (f"{quote(name)}/" if name else "")
    )
    return prefix.rstrip("/") + "/gpupool/hibernate-now"


def hibernate_on(services: ApiServices, user: User, name: str) -> bool:
    groups = sorted(g.name for g in getattr(user, "groups", ()))
    return available(services, groups, getattr(user, "spawners", {}).get(name))


def shares_for(
    root: ApiRoot, user: User | None, now: float | None = None, base_url: str = ""
) -> list[dict[str, Any]]:
    """Each of `user`'s servers holding a GPU share, with when the culler last said it stops,
    for the hub's home page: [{"name", "share", "stops", "hibernate_url"}], sorted by server name."""
    if user is None or root.api_services is None:
        return []
    pool = root.pool
    found = findings(root.api_services, pool, root.hub, user.name)
    now = time.time() if now is None else now
    out = []
    for held in pool.holdings(user.name):  # a parked share too: it still counts, and says it is parked
        w = found.get(f"{user.name}/{held.server_name}")
        cull_at = w["cull_at"] if w is not None else None
        stops = "no time limit"
        if cull_at:
            left = max(0, int((cull_at - now) // 60))
            stops = (
                f"stops at {time.strftime('%H:%M', time.localtime(cull_at))}"
                f" (in {left // 60} h {left % 60} min)"
                if left >= 60
                else f"stops at {time.strftime('%H:%M', time.localtime(cull_at))} (in {left} min)"
            )
        out.append(
            {
                "name": held.server_name,
                "share": format_gpus(held.milli) + (" (parked)" if held.parked else ""),
                "stops": stops,
                # parked already: nothing to hibernate; hibernation off for the user's group: none either
                "hibernate_url": ""
                if held.parked or not hibernate_on(root.api_services, user, held.server_name)
                else hibernate_url(user, held.server_name, base_url),
            }
        )
    return sorted(out, key=lambda s: s["name"])


# what its owner does about it, after the reason: the home page and the "Server not running" page
AGAIN = "Start it again when you need it."
WAKE = "Start it to wake it."
OVER_MEMORY = "Start it again with a larger size (its memory limit comes with it), or use less memory."
TODO = {
    CullReason.MEMORY: "Start it again with a larger GPU share, or free GPU memory in your code.",
    CullReason.BUDGET: "It starts again once your GPU-hour budget allows; the usage page says when.",
}


def todo_for(kind: str) -> str:
    """What to do after a stop that carries no culler reason: the kernel's kill over the memory limit."""
    return OVER_MEMORY if kind == EventKind.OOM else AGAIN


def duration(seconds: float) -> str:
    """'45 min', '2 h 10 min', '3 h': how long, as the time left on the home page reads."""
    minutes = max(0, int(seconds // 60))
    hours, rest = divmod(minutes, 60)
    if not hours:
        return f"{rest} min"
    return f"{hours} h {rest} min" if rest else f"{hours} h"


# a server stopped by the culler, hibernated by its user, or killed over its memory limit (the
# OOM event's message says "stopped because out of memory (over its 8 GiB memory limit)")
STOPS = (EventKind.CULL, EventKind.HIBERNATE, EventKind.OOM)


def retention_for(root: ApiRoot, user: User | None, now: float | None = None) -> list[RetentionWarning]:
    """The user's hibernated states that retention deletes within a few
    days ("your hibernated variables of a.ipynb are deleted after Mon 30 Nov 2026"), of servers
    not running (a running one's notebooks are being woken)."""
    from gpupool.api.hibernation import records, retention_warnings

    if user is None or root.api_services is None:
        return []
    pool = root.pool
    running = {row.name for row in pool.store.allocations(kind=WorkloadKind.BUILD, owner=user.name)}
    keep = root.api_services.hibernate_keep_days
    rows = [r for r in records(pool.store, user.name) if r.get("name") not in running]
    return retention_warnings(rows, keep, time.time() if now is None else now)


def stops_for(
    root: ApiRoot, user: User | None, now: float | None = None, within_s: float = 7 * 86400
) -> list[dict[str, Any]]:
    """Each of `user`'s servers the idle culler stopped (or the kernel, over its memory limit), and
    not started since: [{"name", "message", "todo"}] — "stopped at 18:00: end of the workday",
    "Start it again when you need it.". Before, the home page said only
    "Server not running", with no reason."""
    if user is None or root.api_services is None:
        return []
    pool = root.pool
    now = time.time() if now is None else now
    latest: dict[str, Any] = {}
    for e in pool.store.events(limit=200, owner=user.name):  # newest first
        if e.kind in STOPS or (e.kind == EventKind.ALLOCATE and e.message.startswith("build ")):  # a start
            latest.setdefault(e.name, e)
    running = {row.name for row in pool.store.allocations(kind=WorkloadKind.BUILD, owner=user.name)}
    out = []
    for name, e in latest.items():
        at = e.time.replace(tzinfo=dt.UTC).timestamp()
        if e.kind not in STOPS or name in running or now - at > within_s or "dry run" in e.message:
            continue
        when = time.strftime("%H:%M" if now - at < 86400 else "%a %H:%M", time.localtime(at))
        if e.kind == EventKind.HIBERNATE:  # the user's own %gpupool hibernate
            out.append(
                {
                    "name": name,
                    "message": f"hibernated at {when} (you asked) — your variables come back when you start",
                    "todo": WAKE,
                }
            )
            continue
        reason = (e.data or {}).get("reason", "")
        why = (
            STOPPED.get(reason) or e.message.partition(" stopped because ")[2] or "the idle culler stopped it"
        )
        if " hibernated (" in e.message and "your variables come back" in e.message:
            # the culler saved the kernels first (gpupool.gpu.hibernate): nothing is lost
            why = STOPPED.get(reason) or e.message.partition(" stopped because ")[2].partition(":")[0] or why
            out.append(
                {
                    "name": name,
                    "message": f"hibernated at {when} ({why}) — your variables come back when you start",
                    "todo": WAKE,
                }
            )
            continue
        idle = (e.data or {}).get("idle_s")
        after = f" after {duration(idle)} idle" if isinstance(idle, int) and idle >= 60 else ""
        out.append(
            {
                "name": name,
                "message": f"stopped at {when}{after}: {why}",
                "todo": TODO.get(reason) or todo_for(e.kind),
            }
        )
    return sorted(out, key=lambda s: s["name"])


def stopped_server(
    root: ApiRoot, user: User | None, name: str, now: float | None = None
) -> dict[str, object] | None:
    """Why the culler stopped (or hibernated) this server of `user`'s and what to do, for the
    hub's "Server not running" page (hub_ext/templates/not_running.html), in the home page's
    words: {"name", "message", "todo"}; None when it was not the culler (or it runs again)."""
    return next((s for s in stops_for(root, user, now) if s["name"] == (name or "")), None)
