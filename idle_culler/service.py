"""The culler service: each pass samples GPU use, decides, warns, culls and reports.

Started by the hub (`gpupool.configure(c, culler=True)`) with its own token and the
least privilege it needs, like jupyterhub-idle-culler. Time comes from a clock that tests
replace (`--clock-file`), so a test travels hours without sleeping.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import logging
import os
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from enum import StrEnum
from functools import partial
from typing import Any

# the hub's own helper for admin hooks that may be async; the hub starts the culler from its own
# environment (gpupool.idle_culler.service_definition), so jupyterhub is installed where it runs
from jupyterhub.utils import maybe_future

from gpupool.idle_culler.config import IdleCuller
from gpupool.idle_culler.metrics import Metrics
from gpupool.idle_culler.policy import (
    PARKED,
    Decision,
    IdleTracker,
    Workspace,
    decide,
    extended_end,
    idle_for,
)
from gpupool.idle_culler.sampler import GPUUse, Sampler, Target, make_sampler
from gpupool.vocab.culler_wire import CullReport, CullTarget, Finding, ReportEvent, parse_targets
from gpupool.vocab.culling import BudgetAction, CullAction, CullReason
from gpupool.vocab.hibernate_wire import HibernateAnswer, HibernateRequest, answer_of, saved_summary
from gpupool.vocab.kinds import EventKind

log = logging.getLogger("gpupool.culler")


class Act(StrEnum):
    """What a decision asks of the hub or the server."""

    RESTART = "restart"  # restart the kernels over their GPU memory
    PARK = "park"
    HIBERNATE = "hibernate"  # save the kernels' variables, then stop
    CULL = "cull"  # stop


@dataclass(frozen=True)
class Step:
    """One decision that needs a call, and where its outcome goes in the pass's report."""

    act: Act
    key: str  # "owner/name"
    ws: Workspace
    decision: Decision
    target: CullTarget
    row: int  # its finding in the report
    at: int  # its place among the events
    now: float


def service_definition(
    name: str, api_url: str, config: dict[str, Any] | None = None
) -> tuple[dict[str, Any], dict[str, object]]:
    """The hub's service entry and its role (jupyterhub-idle-culler's scopes, plus reading
    the gpupool API for GPU shares and posting its findings there)."""
    service = {
        "name": name,
        "command": [sys.executable, "-m", "gpupool.idle_culler", f"--gpupool-url={api_url}"],
        # configure(c) runs in the hub process: its pid tells the culler whom to live and die with
        "environment": {"GPUPOOL_CULLER_CONFIG": json.dumps(config or {}), HUB_PID: str(os.getpid())},
    }
    scopes = [
        "list:users",
        "read:users:activity",
        "read:servers",
        "delete:servers",
        "access:services!service=gpupool",
    ]
    cfg = IdleCuller(**(config or {}))
    if cfg.restarts_kernels() or cfg.hibernates():
        # the restart-kernel resolver and hibernation talk to the servers' own APIs: the narrowest
        # scope for that is access to every server, so it is granted only when a rule needs it
        scopes.append("access:servers")
    return service, {"name": name, "services": [name], "scopes": scopes}


def parse_time(text: str | None) -> float | None:
    if not text:
        return None
    return dt.datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


HUB_PID = "GPUPOOL_HUB_PID"
HIBERNATE_TIMEOUT_S = 900.0  # the server's answer once every kernel saved: 8 GiB at ~0.2 GiB/s and more
PAGINATION = "application/jupyterhub-pagination+json"
PAGE = 100  # users per page: short enough that one page never holds the hub long for other users
MAX_PAGES = 10_000  # 2 million users at JupyterHub's largest page: a loop guard, not a limit


class Client:
    def __init__(self, token: str, timeout: float = 30) -> None:
        self.token, self.timeout = token, timeout

    def call(
        self,
        method: str,
        url: str,
        body: Any = None,
        accept: str = "application/json",
        timeout: float | None = None,
    ) -> Any:
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(
            url, data=data, method=method, headers={"Authorization": f"token {self.token}", "Accept": accept}
        )
        with urllib.request.urlopen(req, timeout=timeout or self.timeout) as r:
            text = r.read().decode()
        return json.loads(text) if text else None

    def paginated(self, url: str, concurrency: int = 1) -> list[Any]:
        """Every item of a JupyterHub list, page by page (jupyterhub-idle-culler's
        fetch_paginated habit): the hub returns at most its page limit (200 by default) per
        request, so one plain GET misses the rest of a large class. After the first page, which
        says how many there are, at most `concurrency` pages are read at once."""
        first = self.call("GET", url, accept=PAGINATION)
        if isinstance(first, list):  # a hub too old to paginate answers with everything
            return first
        items: list[Any] = list(first["items"])
        pages = 1
        nxt = (first.get("_pagination") or {}).get("next")
        offsets = _remaining_offsets(first.get("_pagination") or {}, concurrency)
        if offsets:
            with ThreadPoolExecutor(min(concurrency, len(offsets))) as pool:
                answers = list(
                    pool.map(lambda o: self.call("GET", _at_offset(url, *o), accept=PAGINATION), offsets)
                )
            for page in answers:
                items.extend(page["items"])
            pages += len(answers)
            nxt = (answers[-1].get("_pagination") or {}).get("next")  # users who joined meanwhile
        while nxt:
            if pages >= MAX_PAGES:
                raise ValueError(f"more than {MAX_PAGES} pages at {url}")
            page = self.call("GET", nxt["url"], accept=PAGINATION)
            items.extend(page["items"])
            pages += 1
            nxt = (page.get("_pagination") or {}).get("next")
        return items


def _remaining_offsets(pagination: dict[str, Any], concurrency: int) -> list[tuple[int, int]]:
    """(offset, limit) of the pages after the first, from the first page's _pagination; none
    when reading them one by one (concurrency 1) or when the hub's numbers are not sane."""
    nxt, total, limit = pagination.get("next"), pagination.get("total"), pagination.get("limit")
    if concurrency <= 1 or not nxt:
        return []
    start = nxt.get("offset")
    if type(total) is not int or type(limit) is not int or type(start) is not int:
        return []
    if limit <= 0 or not 0 < start < total or (total - start) // limit >= MAX_PAGES:
        return []
    return [(offset, limit) for offset in range(start, total, limit)]


def _at_offset(url: str, offset: int, limit: int) -> str:
    parts = urllib.parse.urlsplit(url)
    query = [(k, v) for k, v in urllib.parse.parse_qsl(parts.query) if k not in ("offset", "limit")]
    query += [("offset", str(offset)), ("limit", str(limit))]
    return urllib.parse.urlunsplit(parts._replace(query=urllib.parse.urlencode(query)))


class Culler:
    def __init__(
        self,
        cfg: IdleCuller,
        client: Client,
        hub_api: str,
        gpupool_url: str,
        sampler: Sampler,
        clock: Callable[[], float] = time.time,
        metrics: Metrics | None = None,
    ) -> None:
        self.cfg, self.client, self.hub_api = cfg, client, hub_api.rstrip("/")
        self.gpupool = gpupool_url.rstrip("/") + "/"
        self.sampler, self.clock, self.metrics = sampler, clock, metrics
        self.policy = cfg.policy()
        self.arbiter = cfg.arbiter_hook()  # may veto a decision (jupyterhub-idle-culler's cull_arbiter_hook)
        # where an async arbiter's answers are awaited: one loop for the culler's life, so what the
        # hook keeps between calls (a lock, a client session) stays on the loop it was made on
        self.arbiter_loop: asyncio.AbstractEventLoop | None = None
        self.trackers: dict[str, IdleTracker] = {}
        self.memory_over: dict[str, float] = {}
        self.warned: dict[str, str] = {}  # key -> reason last warned about
        self.park_failed: set[str] = set()  # parking did not work: the stop rules apply instead
        self.hibernate_cap: dict[str, int] = {}  # key -> the bytes its hibernation may save (this pass)
        self.hibernated: dict[str, HibernateAnswer] = {}  # key -> what the server said it saved (this pass)

    def servers(self) -> dict[str, dict[str, Any]]:
        users = self.client.paginated(f"{self.hub_api}/users?state=active&limit={PAGE}", self.cfg.concurrency)
        out = {}
        for user in users:
            for name, server in (user.get("servers") or {}).items():
                out[f"{user['name']}/{name}"] = server
        return out

    def run_pass(self) -> CullReport:
        """One pass: sample GPU use, decide each workspace, act on the decisions that need a call,
        report the findings and events to the hub."""
        now = self.clock()
        targets, skipped = parse_targets(self.client.call("GET", self.gpupool + "api/culler/targets"))
        for why in skipped:  # judged again next pass, if the hub then sends it whole
            log.warning("skipping a target the hub sent that the culler cannot read: %s", why)
        uses = self.sample(targets)
        report, events, steps = self.decide(targets, self.servers(), uses, now)
        self.act(steps, report, events)
        for key in set(self.trackers) - {f"{t['owner']}/{t['name']}" for t in targets}:
            self.forget(key)  # a new session starts with a clean idle count
        out: CullReport = {
            "pass_time": now,
            "workspaces": report,
            "events": [e for e in events if e is not None],
        }
        self.client.call("POST", self.gpupool + "api/culler/report", dict(out))
        return out

    def sample(self, targets: list[CullTarget]) -> dict[str, GPUUse]:
        """GPU use of each workspace that holds a GPU now (a parked one holds none to sample)."""
        return self.sampler.sample(
            [
                Target(
                    t["owner"],
                    t["name"],
                    t["pid"],
                    pod_uid=t["pod_uid"],
                    gpu_uuids=tuple(t["gpu_uuids"]),
                    whole_gpus=t["whole_gpus"],
                )
                for t in targets
                if not t.get("parked")
            ]
        )

    def decide(
        self,
        targets: list[CullTarget],
        servers: dict[str, dict[str, Any]],
        uses: dict[str, GPUUse],
        now: float,
    ) -> tuple[list[Finding], list[ReportEvent | None], list[Step]]:
        """The findings of the pass, its warnings (None: the place of an event that follows an
        action's outcome), and the actions that need a call to the hub or a server."""
        report: list[Finding] = []
        events: list[ReportEvent | None] = []
        steps: list[Step] = []
        for t in targets:
            key = f"{t['owner']}/{t['name']}"
            server = servers.get(key)
            if server is None or not server.get("ready"):
                continue  # starting or stopping: not ours to judge yet
            # the profile the spawner offered and started (never the user's own words in user_options:
            # a made-up name must not pick up an admin's profile override)
            limits = self.policy.limits_for(t["groups"], t.get("profile") or "")
            tracker = self.trackers.setdefault(key, IdleTracker(limits.window_s, limits.util_threshold_pct))
            use = uses.get(key)
            if use is not None:
                tracker.add(now, use.util_pct)
                if use.memory_mib > t["memory_limit_mib"] > 0:
                    self.memory_over.setdefault(key, now)
                else:
                    self.memory_over.pop(key, None)
            fresh = tracker.fresh(now, limits.stale_after_s)
            ws = Workspace(
                owner=t["owner"],
                name=t["name"],
                started=parse_time(server.get("started")) or now,
                last_activity=parse_time(server.get("last_activity")),
                gpu_idle_s=tracker.idle_s if fresh else None,
                memory_mib=use.memory_mib if use else 0,
                memory_limit_mib=t["memory_limit_mib"],
                memory_over_since=self.memory_over.get(key),
                extended=t["extended"],
                exempt=self.cfg.exempt(t["owner"], t["admin"]),
                parked=bool(t.get("parked")),
                park_failed=key in self.park_failed,
                budget=BudgetAction(t["budget"])
                if t.get("budget") in tuple(BudgetAction)
                else BudgetAction.NONE,
            )
            d = decide(ws, now, limits)
            if d.action in (
                CullAction.PARK,
                CullAction.CULL,
                CullAction.RESOLVE_MEMORY,
            ) and not self.arbiter_allows(d, t, ws):
                d = Decision(
                    CullAction.KEEP, d.reason, d.cull_at, f"kept by the arbiter hook ({d.action}: {d.reason})"
                )
            finding: Finding = {
                "owner": ws.owner,
                "name": ws.name,
                "action": d.action,
                "reason": d.reason,
                "cull_at": d.cull_at,
                "message": d.message,
                "gpu_idle_s": ws.gpu_idle_s,
                "gpu_util_pct": use.util_pct if use else None,
                "memory_mib": ws.memory_mib,
                "memory_limit_mib": ws.memory_limit_mib,
                "extended": ws.extended,
                # the end once extended: what the hub shows the moment Extend is pressed
                "extended_cull_at": extended_end(ws, now, limits),
                # the JupyterLab item shows this text and offers Resume ("" when not parked)
                "gpu_data": fresh,
                "parked": PARKED if ws.parked else "",
            }
            report.append(finding)
            if self.metrics:
                self.metrics.observe(ws, t["milli"], use, fresh)
            if d.action == CullAction.WARN and self.warned.get(key) != d.reason:
                self.warned[key] = d.reason
                events.append(
                    {
                        "kind": EventKind.MEMORY if d.reason == CullReason.MEMORY else EventKind.WARN,
                        "owner": ws.owner,
                        "name": ws.name,
                        "reason": d.reason,
                        "message": f"{key} {d.message}",
                    }
                )
            elif d.action == CullAction.KEEP:
                self.warned.pop(key, None)
            elif d.action in (CullAction.PARK, CullAction.CULL, CullAction.RESOLVE_MEMORY):
                kind = (
                    "restart"
                    if d.action == CullAction.RESOLVE_MEMORY and limits.memory_resolver == "restart-kernel"
                    else "park"
                    if d.action == CullAction.PARK
                    else "hibernate"
                    if limits.hibernate and d.action == CullAction.CULL
                    else "cull"
                )
                if kind == "hibernate":
                    self.hibernate_cap[key] = int(limits.hibernate_max_gib * (1 << 30))
                events.append(None)  # its place: the event follows the outcome
                steps.append(Step(Act(kind), key, ws, d, t, len(report) - 1, len(events) - 1, now))
        return report, events, steps

    def act(self, steps: list[Step], report: list[Finding], events: list[ReportEvent | None]) -> None:
        """The calls, at most `concurrency` at once; their outcomes recorded in the order of the pass."""
        done = self._bounded([partial(self._act, step) for step in steps])
        for step, ok in zip(steps, done, strict=True):
            self._record(step, ok, report, events)

    def arbiter_allows(self, d: Decision, target: CullTarget, ws: Workspace) -> bool:
        """Ask the admin's arbiter hook (if any) whether to act on `d`; a hook that raises is
        logged and the decision stands (a broken hook must not keep every GPU forever)."""
        if self.arbiter is None:
            return True
        workspace = {
            "owner": ws.owner,
            "name": ws.name,
            "groups": list(target.get("groups") or []),
            "admin": bool(target.get("admin")),
            "profile": target.get("profile") or "",
            "started": ws.started,
            "last_activity": ws.last_activity,
            "gpu_idle_s": ws.gpu_idle_s,
            "memory_mib": ws.memory_mib,
            "parked": ws.parked,
            "extended": ws.extended,
        }
        try:
            return bool(self.settled(self.arbiter(action=d.action, reason=d.reason, workspace=workspace)))
        except Exception:  # noqa: BLE001 - the admin's code: any failure
            log.exception(
                "the arbiter hook failed on %s/%s; acting as decided (%s)", ws.owner, ws.name, d.action
            )
            return True

    def settled(self, answer: object) -> object:
        """The arbiter's answer, awaited when it is one to await (a coroutine, a future), with
        JupyterHub's maybe_future as the hub awaits its admin hooks: a coroutine object is truthy,
        so reading it as the answer would let the culler act on every veto of an async hook."""

        async def wait() -> object:
            return await maybe_future(answer)

        if self.arbiter_loop is None:
            self.arbiter_loop = asyncio.new_event_loop()
        return self.arbiter_loop.run_until_complete(wait())

    def close(self) -> None:
        if self.arbiter_loop is not None:
            self.arbiter_loop.close()
            self.arbiter_loop = None

    def _bounded(self, calls: list[Callable[[], bool]]) -> list[bool]:
        if self.cfg.concurrency <= 1 or len(calls) <= 1:
            return [call() for call in calls]
        with ThreadPoolExecutor(min(self.cfg.concurrency, len(calls))) as pool:
            return list(pool.map(lambda call: call(), calls))

    def _act(self, step: Step) -> bool:
        """The hub call of one decision (in a worker thread): did it work?"""
        kind, key, ws, t = step.act, step.key, step.ws, step.target
        if self.cfg.dry_run:
            return True
        if kind == "restart":
            return self.restart_kernels(t["server_url"], key)
        if kind == "park":
            return self.park(ws.owner, ws.name, key)
        if kind == "hibernate":
            self.hibernated[key] = self.hibernate(t["server_url"], key, self.hibernate_cap.pop(key))
        return self.stop(ws.owner, ws.name)

    def _record(self, step: Step, ok: bool, report: list[Finding], events: list[ReportEvent | None]) -> None:
        """What a decision's outcome changes: events, the report, the idle counts, the metrics."""
        kind, key, ws, d, row, at, now = (
            step.act,
            step.key,
            step.ws,
            step.decision,
            step.row,
            step.at,
            step.now,
        )
        if kind == "restart":
            if ok:
                dry = " (dry run: not restarted)" if self.cfg.dry_run else ""
                self.memory_over.pop(key, None)  # a fresh kernel gets a fresh grace period
                self.warned.pop(key, None)  # and a fresh warning if it is over again
                events[at] = {
                    "kind": EventKind.MEMORY,
                    "owner": ws.owner,
                    "name": ws.name,
                    "reason": CullReason.RESTART_KERNEL,
                    "message": f"{key} restarted its kernels because it uses {ws.memory_mib} MiB of GPU"
                    f" memory, more than its share of {ws.memory_limit_mib} MiB{dry}",
                }
                if self.metrics:
                    self.metrics.culls.labels(reason="memory-restart").inc()
        elif kind == "park":
            if ok:
                dry = " (dry run: not parked)" if self.cfg.dry_run else ""
                events[at] = {
                    "kind": EventKind.PARK,
                    "owner": ws.owner,
                    "name": ws.name,
                    "reason": d.reason,
                    "message": f"{key} {d.message}{dry}",
                }
                report[row]["parked"] = "" if self.cfg.dry_run else PARKED
                report[row]["action"] = CullAction.KEEP
                self.trackers.pop(key, None)  # a resumed GPU starts with a fresh idle count
                if self.metrics:
                    self.metrics.culls.labels(reason="park").inc()
        elif ok:
            dry = " (dry run: not stopped)" if self.cfg.dry_run else ""
            message, saved = d.message, None
            if kind == "hibernate" and not self.cfg.dry_run:
                answer = self.hibernated.pop(key, HibernateAnswer(ok=False))
                message, saved = (
                    hibernated_message(answer, d.message),
                    saved_summary(answer.get("kernels", [])),
                )
            event: ReportEvent = {
                "kind": EventKind.CULL,
                "owner": ws.owner,
                "name": ws.name,
                "reason": d.reason,
                "message": f"{key} {message}{dry}",
            }
            if saved:  # the size as the save reported it: the hub keeps it without opening the user's files
                event["hibernated"] = saved
            if (idle := idle_for(ws, now, d.reason)) is not None:
                event["idle_s"] = round(
                    idle
                )  # the "Server not running" page says "stopped after 30 min idle"
            events[at] = event
            if not self.cfg.dry_run:
                self.forget(key)
            if self.metrics:
                self.metrics.culls.labels(reason=d.reason).inc()

    def stop(self, owner: str, name: str) -> bool:
        """Ask the hub to stop a server: True once the hub has the request (its answer, even an
        error, or no answer within the client's timeout: the hub goes on stopping it); False
        when it could not be sent (the next pass asks again). Never raises: one stop that
        fails must not end the pass for the rest of the class."""
        quoted = urllib.parse.quote(owner)
        path = f"/users/{quoted}/servers/{urllib.parse.quote(name)}" if name else f"/users/{quoted}/server"
        try:
            self.client.call("DELETE", self.hub_api + path)
        except urllib.error.HTTPError as err:
            log.error("could not stop %s/%s: %s", owner, name, err)
        except TimeoutError:  # sent, and the hub is slow to answer: it finishes the stop without us
            log.warning(
                "the hub did not answer the stop of %s/%s within %s s; it goes on",
                owner,
                name,
                self.client.timeout,
            )
        except OSError as err:  # not sent (URLError: refused, a connect timeout)
            log.error("could not ask the hub to stop %s/%s: %s; trying again next pass", owner, name, err)
            return False
        return True

    def hibernate(self, server_url: str, key: str, max_bytes: int) -> HibernateAnswer:
        """Ask the workspace's own server to save each kernel's variables (as the user, into the
        user's home); what it answered, {"ok": False, "error": ...} when it could not. The stop
        follows either way: a failed hibernation is a stop as before, with the reason."""
        if not server_url:
            return {"ok": False, "error": "the hub gave no server URL"}
        body: HibernateRequest = {
            "cap_bytes": max_bytes,
            "quota_bytes": int(self.cfg.hibernate_quota_gib * (1 << 30)),
            "keep_days": int(self.cfg.hibernate_keep_days),
        }
        try:
            # saving takes seconds per GiB (docs/culling.md#hibernation): far longer than a hub call
            answer = self.client.call(
                "POST", server_url.rstrip("/") + "/gpupool/hibernate", body, timeout=HIBERNATE_TIMEOUT_S
            )
        except (OSError, ValueError) as err:  # URLError/HTTPError are OSErrors
            log.error("could not hibernate %s: %s; stopping it as before", key, err)
            return {"ok": False, "error": f"its server did not answer ({err})"}
        return answer_of(answer)  # well-formed kernels only (gpupool.vocab.hibernate_wire)

    def park(self, owner: str, name: str, key: str) -> bool:
        """Ask the hub to park the workspace's GPU; on failure the stop rules take over."""
        try:
            self.client.call("POST", self.gpupool + "api/parking/park", {"owner": owner, "server": name})
        except (OSError, ValueError) as err:  # URLError/HTTPError are OSErrors
            log.error("could not park %s: %s; its GPU-idle limits apply instead", key, err)
            self.park_failed.add(key)
            return False
        return True

    def restart_kernels(self, server_url: str, key: str) -> bool:
        """Restart every kernel of a server through its Jupyter Server API (the token's
        access:servers scope); False (logged, retried next pass) when that fails."""
        if not server_url:
            log.error("cannot restart the kernels of %s: the hub gave no server URL", key)
            return False
        base = server_url.rstrip("/") + "/api/kernels"
        try:
            for kernel in self.client.call("GET", base) or []:
                self.client.call("POST", f"{base}/{urllib.parse.quote(kernel['id'])}/restart")
        except (OSError, ValueError, KeyError) as err:  # URLError/HTTPError are OSErrors
            log.error("could not restart the kernels of %s: %s; retrying next pass", key, err)
            return False
        log.info("restarted the kernels of %s (GPU memory over its share)", key)
        return True

    def forget(self, key: str) -> None:
        self.trackers.pop(key, None)
        self.memory_over.pop(key, None)
        self.warned.pop(key, None)
        self.park_failed.discard(key)


def hibernated_message(answer: HibernateAnswer, stopped: str) -> str:
    """The cull event's words: what was hibernated, or why not (then lost as before)."""
    kernels = answer.get("kernels", [])
    saved = [k for k in kernels if k["ok"]]
    if saved:  # a kernel of another language, or one over the cap, is lost alone
        size = sum(k.get("bytes", 0) for k in saved) / (1 << 20)
        lost = sorted({n for k in saved for n in (k.get("skipped") or {})})
        tail = f"; not kept: {', '.join(lost[:10])}" if lost else ""
        failed = [k for k in kernels if not k["ok"]]
        also = (
            f"; {len(failed)} other kernel{'' if len(failed) == 1 else 's'} could not be hibernated"
            f" ({str(failed[0].get('error'))[:200]}): lost"
            if failed
            else ""
        )
        return (
            f"hibernated ({len(saved)} kernel{'' if len(saved) == 1 else 's'}, {size:.0f} MiB{tail}{also}) and"
            f" {stopped}: your variables come back when you start"
        )
    if answer["ok"]:
        return f"{stopped} (it had no kernels to hibernate)"
    why = answer.get("error") or next((k.get("error") for k in kernels if not k["ok"]), "") or "it failed"
    return f"{stopped}; it could not be hibernated ({str(why)[:200]}): its variables are lost"


def file_clock(path: str) -> Callable[[], float]:
    """Time read from a file (tests travel in time by writing it); real time if it is empty."""

    def now() -> float:
        try:
            with open(path) as f:
                return float(f.read().strip())
        except (OSError, ValueError):
            return time.time()

    return now


def main(argv: list[str] | None = None) -> int:
    """`python -m gpupool.idle_culler` (gpupool.idle_culler.app: config file, flags)."""
    from gpupool.idle_culler.app import main as app_main

    return app_main(argv)


def run(
    cfg: IdleCuller, gpupool_url: str, hub_api: str, once: bool = False, clock_file: str | None = None
) -> int:
    """Cull until the hub that started us goes (or one pass with `once`)."""
    clock = file_clock(clock_file) if clock_file else time.time
    metrics = Metrics(cfg.metrics_port) if cfg.metrics_port else None
    client = Client(os.environ["JUPYTERHUB_API_TOKEN"])
    api = gpupool_url.rstrip("/") + "/"
    sampler = make_sampler(
        cfg.sampler,
        cfg.sampler_arg,
        cfg.node_agent_token_file,
        read=lambda path: client.call("GET", api + path),
    )
    culler = Culler(cfg, client, hub_api, gpupool_url, sampler, clock, metrics)
    parent = int(os.environ.get(HUB_PID, "0") or 0) or os.getppid()
    die_with_parent()
    if hub_gone(parent):  # it died before we could ask to die with it
        log.warning("the hub that started this culler is gone: not starting")
        return 0
    try:
        return _loop(culler, cfg, once, parent)
    except KeyboardInterrupt:  # the hub stops its services with SIGINT
        return 0
    finally:
        culler.close()


def die_with_parent() -> None:
    """The culler is the hub's child: when the hub dies (even by kill -9) the kernel sends us
    SIGTERM, so a restarted hub never finds a second culler acting with a valid token."""
    if sys.platform != "linux":
        return
    import ctypes
    import signal

    PR_SET_PDEATHSIG = 1  # noqa: N806 - the name in <linux/prctl.h>
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    except (OSError, AttributeError) as err:
        log.warning("cannot ask to die with the hub (%s); checking the parent each pass", err)


def hub_gone(parent: int) -> bool:
    """Our parent changed (re-parented to init or a subreaper): the hub that started us is gone."""
    return os.getppid() != parent


def _loop(culler: Culler, cfg: IdleCuller, once: bool, parent: int | None = None) -> int:
    while True:
        if parent is not None and hub_gone(parent):
            log.warning("the hub that started this culler is gone: stopping")
            return 0
        try:
            result = culler.run_pass()
            if result["events"]:
                for e in result["events"]:
                    log.info("%s: %s", e["kind"], e["message"])
        except (OSError, urllib.error.URLError, ValueError) as err:
            log.error("culler pass failed, retrying next pass: %s", err)
        if once:
            return 0
        # wait for the next pass, looking at the parent every second: the parent-death signal
        # is not delivered in every set-up (seen under JupyterHub's service spawner)
        until = time.monotonic() + cfg.interval_s
        while time.monotonic() < until:
            if parent is not None and hub_gone(parent):
                break
            time.sleep(min(1.0, max(0.0, until - time.monotonic())))
