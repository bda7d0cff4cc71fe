"""The hub's record of hibernated sessions (gpupool.gpu.hibernate): who, which server, how many
bytes, when, and when retention deletes it.

The hub never opens the user's ~/.gpupool/hibernate to learn a size (a user-writable tree): the
size is what the save itself reported — the workspace server's answer to the culler (carried in
its cull event) or, for `%gpupool hibernate`, what the kernel posts here with its user's token.
Both are bounded before they are kept. One record per server (`hibernated:<owner>/<name>`), the
last hibernation's; it is dropped when retention has deleted the state.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, cast

from tornado import web

from gpupool.api.auth import APIHandler
from gpupool.hub.adapter import hub_user
from gpupool.vocab.hibernate_wire import (
    HibernatedList,
    HibernationListed,
    HibernationRecord,
    RetentionWarning,
    SavedSummary,
)
from gpupool.vocab.kinds import EventKind

if TYPE_CHECKING:
    from gpupool.api.services import ApiServices
    from gpupool.store import Store

PREFIX = "hibernated:"
MAX_BYTES = 1 << 50
MAX_KERNELS = 1000
MAX_NOTEBOOKS = 50  # names kept per record (the rest counted)
MAX_NAME = 255
WARN_DAYS = 3.0  # retention's warning shows this long before the state is deleted


def key(owner: str, name: str) -> str:
    return f"{PREFIX}{owner}/{name}"


def parse_saved(body: object) -> SavedSummary:
    """What a save reported, checked: {"bytes", "kernels", "notebooks"}. ValueError says what is wrong."""
    if not isinstance(body, dict):
        raise ValueError("hibernated must be an object")
    size, kernels = body.get("bytes", 0), body.get("kernels", 0)
    if type(size) is not int or not 0 <= size <= MAX_BYTES:
        raise ValueError(f"hibernated.bytes must be a whole number from 0 to {MAX_BYTES}")
    if type(kernels) is not int or not 0 <= kernels <= MAX_KERNELS:
        raise ValueError(f"hibernated.kernels must be a whole number from 0 to {MAX_KERNELS}")
    notebooks = body.get("notebooks", [])
    if not isinstance(notebooks, list) or not all(isinstance(n, str) for n in notebooks):
        raise ValueError("hibernated.notebooks must be a list of notebook paths")
    if len(notebooks) > MAX_KERNELS:
        raise ValueError(f"hibernated.notebooks: at most {MAX_KERNELS}")
    names = sorted({n[:MAX_NAME] for n in notebooks if n})
    return {"bytes": size, "kernels": kernels, "notebooks": names[:MAX_NOTEBOOKS]}


def record(store: Store, owner: str, name: str, saved: SavedSummary, by: str, at: float) -> None:
    """Keep the hibernation's record (replacing the server's last one)."""
    row: HibernationRecord = {"owner": owner, "name": name, "by": by, "at": at, **saved}
    store.put_setting(key(owner, name), dict(row))


def records(store: Store, owner: str | None = None) -> list[HibernationRecord]:
    prefix = PREFIX if owner is None else key(owner, "")
    rows = [  # the rows `record` wrote
        cast(HibernationRecord, v)
        for v in store.settings_under(prefix).values()
        if owner is None or v.get("owner") == owner
    ]
    return sorted(rows, key=lambda r: (r.get("owner", ""), r.get("name", "")))


def with_expiry(row: HibernationRecord, keep_days: float) -> HibernationListed:
    """The record as the API shows it: `expires` (seconds since 1970) or None when kept until woken."""
    expires = float(row.get("at") or 0) + keep_days * 86400 if keep_days > 0 else None
    return {**row, "expires": expires}


def prune(store: Store, keep_days: float, now: float) -> list[str]:
    """Drop the records whose state retention has deleted (their keys)."""
    gone: list[str] = []
    if keep_days <= 0:
        return gone
    for k, row in store.settings_under(PREFIX).items():
        if float(row.get("at") or 0) + keep_days * 86400 < now:
            store.delete_setting(k)
            gone.append(k)
    return gone


def _date(t: float) -> str:
    return time.strftime("%a %d %b %Y", time.localtime(t))


def retention_warnings(
    rows: Sequence[HibernationRecord], keep_days: float, now: float, warn_days: float = WARN_DAYS
) -> list[RetentionWarning]:
    """[{"name", "message"}] for each hibernated server whose state retention deletes within
    `warn_days`: "your hibernated variables of a.ipynb are deleted after Mon 30 Nov 2026" (at the
    culler's next hibernation of that user, gpupool.gpu.hibernate.expire)."""
    out: list[RetentionWarning] = []
    for row in rows:
        expires = with_expiry(row, keep_days)["expires"]
        if expires is None or not now <= expires <= now + warn_days * 86400:
            continue
        notebooks = row.get("notebooks") or []
        of = ", ".join(notebooks) if notebooks else f"server {row.get('name') or 'default'}"
        out.append(
            {
                "name": str(row.get("name", "")),
                "message": f"your hibernated variables of {of} are deleted after {_date(expires)}"
                " (start the server and open the notebook to keep them)",
            }
        )
    return out


def hibernated_text(row: HibernationRecord, keep_days: float) -> str:
    """One record in the user's words (%gpupool, the home page)."""
    at = float(row.get("at") or 0)
    size = int(row.get("bytes") or 0) / (1 << 20)
    who = "you hibernated it" if row.get("by") == "user" else "the idle culler hibernated it"
    expires = with_expiry(row, keep_days)["expires"]
    kept = f"; kept until {_date(expires)}" if expires is not None else ""
    return (
        f"hibernated at {time.strftime('%a %H:%M', time.localtime(at))} ({who}, {size:.0f} MiB)"
        f" — your variables come back when you start it and open the notebook{kept}"
    )


OFF = "hibernation is off for your group on this hub (c.IdleCuller.hibernate): ask an admin to turn it on"


def available(services: ApiServices, groups: Sequence[str], spawner: object) -> bool:
    """Whether a user in `groups` may hibernate this server (its spawner, None: not running, the
    default profile): where the culler's rules hibernate it. A user's own "Hibernate now" asks
    this first (gpupool.widgets.labserver), and its record is refused here where it is off."""
    from gpupool.api.culler import spawner_profile  # that module imports this one

    on = services.hibernates
    return on is not None and on(groups, spawner_profile(spawner) if spawner is not None else "")


class HibernatedHandler(APIHandler):
    """GET: the caller's own hibernated servers. POST: a user's own hibernation (`%gpupool
    hibernate`) is recorded, as the culler's is, so the home page and admins see it."""

    max_body = 64 * 1024

    @web.authenticated
    def get(self) -> None:
        keep = self.services.hibernate_keep_days
        rows = [with_expiry(r, keep) for r in records(self.pool.store, self.caller.name)]
        now = time.time()
        answer: HibernatedList = {
            "keep_days": keep,
            "hibernated": [{**r, "message": hibernated_text(r, keep)} for r in rows],
            "warnings": retention_warnings(rows, keep, now),
            # ?server=NAME: may the caller hibernate that server of theirs now (JupyterLab's
            # "Hibernate now" is offered only then, and the server refuses it otherwise)
            "available": self.available(self.get_argument("server", "")),
            "off_message": OFF,
        }
        self.write_json(answer)

    def available(self, name: str) -> bool:
        caller = self.caller
        user = hub_user(self.directory.hub, caller.name) if caller.kind == "user" else None
        spawner = user.spawners.get(name) if user is not None and len(name) <= MAX_NAME else None
        return available(self.services, caller.groups, spawner)

    @web.authenticated
    def post(self) -> None:
        caller = self.caller
        if caller.kind != "user":
            raise web.HTTPError(403, "a user records their own hibernation")
        body = self.json_body()
        name = body.get("server", "")
        if not isinstance(name, str) or len(name) > MAX_NAME:
            raise web.HTTPError(400, f"server must be a server name (at most {MAX_NAME} characters)")
        if not self.available(name):
            raise web.HTTPError(403, OFF)
        try:
            saved = parse_saved(body.get("hibernated"))
        except ValueError as err:
            raise web.HTTPError(400, str(err)) from None
        now = time.time()
        record(self.pool.store, caller.name, name, saved, "user", now)
        self.pool.store.record(
            EventKind.HIBERNATE,
            f"{caller.name}/{name} hibernated by its user ({saved['kernels']} kernel"
            f"{'' if saved['kernels'] == 1 else 's'}, {saved['bytes'] / (1 << 20):.0f} MiB):"
            " your variables come back when you start",
            owner=caller.name,
            name=name,
            bytes=saved["bytes"],
        )
        self.write_json({"ok": True})


class AdminHibernatedHandler(APIHandler):
    """GET (admins): every hibernated session with its size, when, and when retention deletes it."""

    @web.authenticated
    def get(self) -> None:
        if not self.caller.admin:
            raise web.HTTPError(403, "only admins list every user's hibernated sessions")
        keep = self.services.hibernate_keep_days
        rows = [with_expiry(r, keep) for r in records(self.pool.store)]
        self.write_json(
            {"keep_days": keep, "hibernated": rows, "bytes": sum(int(r.get("bytes") or 0) for r in rows)}
        )


ROUTES = (
    ("api/hibernated", HibernatedHandler),
    ("api/admin/hibernated", AdminHibernatedHandler),
)
