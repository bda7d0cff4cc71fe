"""Where the GPU-hours go, over REST: usage reports (JSON or CSV, bounded and paged), the caller's
GPU-hour budget, and the admins' top-ups and exemptions.

    GET    api/usage?period=7d&by=group&sort=waste&limit=100&offset=0[&step=3600][&format=csv]
    GET    api/usage?from=2026-11-01&to=2026-11-08&by=project
    GET    api/budget[?user=NAME]           the caller's budget (admins: anyone's), with right-sizing advice
    GET    api/budgets                      admins: the budgets, the grants in force, who is near or over
    POST   api/budgets/grants               admins: {"target": "user:ann", "kind": "topup", "gpu_hours": 10,
                                            "days": 7, "note": "thesis deadline"} or kind "exempt"
    DELETE api/budgets/grants/ID            admins: end a grant now

Users see only their own use (every row is theirs); admins everyone's.
"""

from __future__ import annotations

import datetime as dt
import time
from typing import Any

from tornado import web

from gpupool.api.auth import APIHandler, Caller
from gpupool.pool.units import shown
from gpupool.usage.accounting import DIMENSIONS, MILLI_S_PER_GPU_HOUR
from gpupool.usage.budgets import GROUP, USER
from gpupool.usage.service import MAX_BUCKETS, SORTS, UsageService

PERIODS = {
    "1h": 3600,
    "24h": 86400,
    "7d": 7 * 86400,
    "30d": 30 * 86400,
    "90d": 90 * 86400,
    "365d": 365 * 86400,
}
MAX_LIMIT = 1000
MAX_OFFSET = 10**6
MAX_TEXT = 40  # a date or a number, never more


def parse_time(text: str, key: str, now: float) -> int:
    """Epoch seconds, or an ISO date/time (UTC unless it says otherwise), within 1970..now + a year."""
    text = text.strip()
    if not text or len(text) > MAX_TEXT:
        raise web.HTTPError(
            400, f"{key}: a time as epoch seconds or an ISO date such as 2026-11-20, got {shown(text)}"
        )
    if text.isascii() and text.isdigit():
        value = int(text)
    else:
        try:
            d = dt.datetime.fromisoformat(text)
        except ValueError:
            raise web.HTTPError(
                400, f"{key}: a time as epoch seconds or an ISO date such as 2026-11-20, got {shown(text)}"
            ) from None
        value = int((d if d.tzinfo else d.replace(tzinfo=dt.UTC)).timestamp())
    if not 0 <= value <= now + 366 * 86400:
        raise web.HTTPError(400, f"{key}: a time between 1970 and a year from now")
    return value


def parse_period(args: dict[str, str], now: float, retention_days: float) -> tuple[int, int]:
    """[from, to) from `period` (1h, 24h, 7d, 30d, 90d, 365d; the last ...) or `from`/`to`."""
    period = args.get("period")
    if period is not None and ("from" in args or "to" in args):
        raise web.HTTPError(400, "give period or from/to, not both")
    if period is not None or "from" not in args:
        span = PERIODS.get(period or "24h")
        if span is None:
            raise web.HTTPError(400, f"period must be one of {', '.join(PERIODS)}, got {shown(period)}")
        b = int(now) + 1
        return b - span, b
    a = parse_time(args["from"], "from", now)
    b = parse_time(args["to"], "to", now) if "to" in args else int(now) + 1
    longest = max(366, retention_days + 1) * 86400
    if not a < b or b - a > longest:
        raise web.HTTPError(400, f"from must be before to, at most {longest // 86400:.0f} days apart")
    return a, b


def whole(args: dict[str, str], key: str, default: int, lo: int, hi: int) -> int:
    text = args.get(key)
    if text is None:
        return default
    if not (text.isascii() and text.isdigit()) or len(text) > len(str(hi)) or not lo <= int(text) <= hi:
        raise web.HTTPError(400, f"{key} must be a whole number between {lo} and {hi}")
    return int(text)


def one_of(args: dict[str, str], key: str, default: str, choices: tuple[str, ...]) -> str:
    value = args.get(key, default)
    if value not in choices:
        raise web.HTTPError(400, f"{key} must be one of {', '.join(choices)}, got {shown(value)}")
    return value


def auto_step(span: int) -> int:
    """About 48 buckets of a round length."""
    for step in (60, 300, 900, 1800, 3600, 3 * 3600, 6 * 3600, 12 * 3600, 86400, 7 * 86400):
        if span / step <= 60:
            return step
    return 30 * 86400


def report_args(args: dict[str, str], usage: UsageService) -> dict[str, Any]:
    """The report's parameters, each parsed with its bounds (400 with the reason)."""
    known = {"period", "from", "to", "by", "sort", "limit", "offset", "step", "format"}
    unknown = set(args) - known
    if unknown:
        raise web.HTTPError(
            400, f"unknown parameters {shown(sorted(unknown))}; use {', '.join(sorted(known))}"
        )
    a, b = parse_period(args, time.time(), usage.cfg.retention_days)
    step: int | None = None
    if "step" in args:
        step = auto_step(b - a) if args["step"] == "auto" else whole(args, "step", 0, 60, 366 * 86400)
        if (b - a) / step > MAX_BUCKETS:
            raise web.HTTPError(
                400,
                f"step: at most {MAX_BUCKETS} buckets; use a step of at least"
                f" {-(-(b - a) // MAX_BUCKETS)} s for this period",
            )
    return {
        "a": a,
        "b": b,
        "by": one_of(args, "by", "user", DIMENSIONS),
        "sort": one_of(args, "sort", "waste", SORTS),
        "limit": whole(args, "limit", 100, 1, MAX_LIMIT),
        "offset": whole(args, "offset", 0, 0, MAX_OFFSET),
        "step": step,
        "format": one_of(args, "format", "json", ("json", "csv")),
    }


def single_args(handler: web.RequestHandler) -> dict[str, str]:
    """The query's arguments, each given at most once."""
    out = {}
    for key, values in handler.request.query_arguments.items():
        if len(values) != 1:
            raise web.HTTPError(400, f"{shown(key)} given more than once")
        out[key] = values[0].decode("utf-8", "replace")
    return out


class UsageBase(APIHandler):
    @property
    def usage(self) -> UsageService:
        service = self.services.usage
        if service is None:
            raise web.HTTPError(503, "usage accounting is not running on this hub")
        return service

    def groups_of(self, caller: Caller, user: str) -> tuple[str, ...]:
        return caller.groups if user == caller.name else self.usage.groups_of(user)


class UsageHandler(UsageBase):
    @web.authenticated
    async def get(self) -> None:
        caller = self.caller
        p = report_args(single_args(self), self.usage)
        report = await self.usage.report_off_loop(
            p["a"],
            p["b"],
            p["by"],
            owner=None if caller.sees_all else caller.name,
            step=p["step"],
            sort=p["sort"],
            offset=p["offset"],
            limit=p["limit"],
        )
        if p["format"] == "csv":
            self.set_header("Content-Type", "text/csv; charset=utf-8")
            self.set_header("Content-Disposition", f'attachment; filename="gpupool-usage-{p["by"]}.csv"')
            self.finish(self.usage.csv(report))
            return
        self.write_json(report)


class BudgetHandler(UsageBase):
    @web.authenticated
    def get(self) -> None:
        caller = self.caller
        user = self.get_argument("user", caller.name)
        if len(user) > 255 or (user != caller.name and not caller.sees_all):
            raise web.HTTPError(403, "you may read only your own budget")
        groups = self.groups_of(caller, user)
        out = self.usage.budget_json(user, groups)
        advice = self.usage.advice_for(user, groups)
        out["rightsizing"] = (
            None
            if advice is None
            else {
                "current_gpus": advice.current_milli / 1000,
                "suggested_gpus": advice.suggested_milli / 1000,
                "peak_memory_mib": advice.peak_memory_mib,
                "share_memory_mib": advice.share_memory_mib,
                "sessions": advice.sessions,
                "message": advice.message(),
            }
        )
        self.write_json(out)


class BudgetsHandler(UsageBase):
    @web.authenticated
    def get(self) -> None:
        if not self.caller.admin:
            raise web.HTTPError(403, "only admins may read every budget; see yours in api/budget")
        usage = self.usage
        rules = [
            {
                "target": r.target,
                "gpu_hours": r.gpu_hours,
                "window_days": r.window_s / 86400,
                "warn_at": r.warn_pct / 100,
                "min_share_gpus": r.min_share_milli / 1000,
                "shared": r.shared,
                "describe": r.describe(),
            }
            for r in usage.rules
        ]
        self.write_json(
            {"budgets": rules, "grants": usage.ledger.grant_rows(time.time()), "users": usage.budget_users()}
        )


MAX_GRANT_DAYS = 366


def parse_grant(body: dict[str, object]) -> tuple[str, str, int, int, str]:
    """(target, kind, milli-GPU x seconds, seconds it lasts, note) of a grant, or a 400."""
    unknown = set(body) - {"target", "kind", "gpu_hours", "days", "note"}
    if unknown:
        raise web.HTTPError(
            400, f"unknown keys {shown(sorted(unknown))}; use target, kind, gpu_hours, days, note"
        )
    target, kind = body.get("target"), body.get("kind")
    if not isinstance(target, str) or not target.startswith((USER, GROUP)) or not 6 <= len(target) <= 260:
        raise web.HTTPError(400, f"target must be user:NAME or group:NAME, got {shown(target)}")
    if kind not in ("topup", "exempt"):
        raise web.HTTPError(400, f"kind must be topup or exempt, got {shown(kind)}")
    days = body.get("days", 7)
    if isinstance(days, bool) or not isinstance(days, int | float) or not 0 < days <= MAX_GRANT_DAYS:
        raise web.HTTPError(
            400, f"days must be a number of days from 0 to {MAX_GRANT_DAYS}, got {shown(days)}"
        )
    milli_s = 0
    if kind == "topup":
        hours = body.get("gpu_hours")
        if isinstance(hours, bool) or not isinstance(hours, int | float) or not 0 < hours <= 1e6:
            raise web.HTTPError(400, f"gpu_hours must be a number from 0 to 1e6, got {shown(hours)}")
        milli_s = round(hours * MILLI_S_PER_GPU_HOUR)
    elif "gpu_hours" in body:
        raise web.HTTPError(400, "an exemption has no gpu_hours")
    note = body.get("note", "")
    if not isinstance(note, str) or len(note) > 500:
        raise web.HTTPError(400, "note must be text of at most 500 characters")
    return target, kind, milli_s, round(days * 86400), note


class GrantsHandler(UsageBase):
    @web.authenticated
    def post(self) -> None:
        caller = self.caller
        if not caller.admin:
            raise web.HTTPError(403, "only admins may top up budgets or exempt users")
        target, kind, milli_s, seconds, note = parse_grant(self.json_body(max_bytes=4096))
        until = int(time.time()) + seconds
        grant = self.usage.add_grant(target, kind, milli_s, until, caller.name, note)
        self.write_json(
            {
                "id": grant,
                "target": target,
                "kind": kind,
                "gpu_hours": milli_s / MILLI_S_PER_GPU_HOUR,
                "until": until,
            },
            status=201,
        )


class GrantHandler(UsageBase):
    @web.authenticated
    def delete(self, grant_id: str) -> None:
        caller = self.caller
        if not caller.admin:
            raise web.HTTPError(403, "only admins may end budget grants")
        if not (grant_id.isascii() and grant_id.isdigit()) or len(grant_id) > 12:
            raise web.HTTPError(404, f"no grant {shown(grant_id)}")
        if not self.usage.end_grant(int(grant_id), time.time(), caller.name):
            raise web.HTTPError(404, f"no grant {grant_id} in force")
        self.write_json({"ended": int(grant_id)})


ROUTES: tuple[tuple[str, type[APIHandler]], ...] = (
    ("api/usage", UsageHandler),
    ("api/budget", BudgetHandler),
    ("api/budgets", BudgetsHandler),
    ("api/budgets/grants", GrantsHandler),
    (r"api/budgets/grants/([^/]+)", GrantHandler),
)
