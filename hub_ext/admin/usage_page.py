"""The usage page, /hub/gpupool/usage: where the GPU-hours went over a period, in JupyterHub's own
look (a page of the hub, like the GPU pool page). A period picker, GPUs allocated over time
stacked by user, group, project, node pool or kind, the table sortable by waste, the top
over-requesters, what right-sizing would free, train waits per project, and the budgets with
the admins' top-ups and exemptions. The same report as GET api/usage; CSV at usage.csv."""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING, Any

from tornado import web

from gpupool.admin.handlers import ActionBase, AdminBase
from gpupool.admin.stacked import stacked_svg
from gpupool.api.auth import json_object
from gpupool.api.usage import PERIODS, parse_grant, report_args
from gpupool.pool.units import MILLI_S_PER_GPU_HOUR, format_gpu_hours
from gpupool.usage.accounting import DIMENSIONS

if TYPE_CHECKING:
    from gpupool.usage.service import UsageService

PAGE = "usage"


def default_period(usage: UsageService) -> str:
    """The page's first period: the last 24h, or the last hour where everything held in the last
    day began within it (a new hub: its few minutes of use were a sliver of a 24 h plot)."""
    now = usage.now()
    held = usage.ledger.held(now - 86400, now + 1)
    return "1h" if all(h.start >= now - 3600 for h in held) else "24h"


async def usage_view(usage: UsageService, args: dict[str, str], capacity_gpus: float) -> dict[str, object]:
    """What the template renders; a bad parameter is shown as an error above the picker."""
    args = {k: v for k, v in args.items() if v != ""}
    if "period" in args:  # a period picked from the list wins over dates left in the form
        args.pop("from", None)
        args.pop("to", None)
    if "period" not in args and "from" not in args:  # it reads a day of the ledger: off the loop
        args["period"] = await asyncio.to_thread(default_period, usage)
    query = dict(args)
    if len(args.get("to", "")) == 10:  # a date: the whole day is in the period
        try:
            import datetime as dt

            query["to"] = (dt.date.fromisoformat(args["to"]) + dt.timedelta(days=1)).isoformat()
        except ValueError:
            pass  # report_args says what is wrong with it
    error = ""
    try:
        p = report_args({**query, "step": "auto", "limit": args.get("limit", "200")}, usage)
    except web.HTTPError as err:
        error = err.log_message or "bad parameters"
        p = report_args({"period": "24h", "step": "auto", "limit": "200"}, usage)
    report = await usage.report_off_loop(
        p["a"], p["b"], p["by"], step=p["step"], sort="waste", limit=p["limit"]
    )
    series = report["series"]
    money = bool(usage.cfg.currency) or any(r["cost"] for r in report["rows"])
    return {
        "error": error,
        "periods": list(PERIODS),
        "period": args.get("period", "" if "from" in args else "24h"),
        "from": args.get("from", ""),
        "to": args.get("to", ""),
        "by": p["by"],
        "dimensions": DIMENSIONS,
        "start": time.strftime("%Y-%m-%d %H:%M", time.localtime(p["a"])),
        "end": time.strftime("%Y-%m-%d %H:%M", time.localtime(min(p["b"], report["now"]))),
        "plot": stacked_svg(series["keys"], series["gpus"], series["start"], series["step_s"], capacity_gpus),
        "rows": report["rows"],
        "rows_total": report["rows_total"],
        "total": report["total"],
        "currency": usage.cfg.currency,
        "money": money,
        "waits": report["waits"],
        "over_requesters": report["over_requesters"],
        "rightsizing": report["rightsizing"],
        "budgets": [{"target": r.target, "describe": r.describe()} for r in usage.rules],
        "budget_users": usage.budget_users(),
        "grants": usage.ledger.grant_rows(time.time()),
        "gpu_hours": lambda hours: format_gpu_hours(round(hours * MILLI_S_PER_GPU_HOUR)),  # as everywhere
        "csv_query": "&".join(f"{k}={v}" for k, v in args.items() if k in ("period", "from", "to", "by")),
    }


class UsagePage(AdminBase):
    @web.authenticated
    async def get(self) -> None:
        self.admin_caller()
        usage = self.gpupool_services.usage
        if usage is None:
            raise web.HTTPError(503, "usage accounting is not running on this hub")
        args = {k: self.get_argument(k) for k in ("period", "from", "to", "by") if self.get_argument(k, None)}
        view = await usage_view(usage, args, self.gpupool_services.pool.inventory.gpu_count)
        html = await self.render_template("gpupool-usage.html", admin_access=True, **view)
        self.finish(html)


class UsageCSV(AdminBase):
    @web.authenticated
    async def get(self) -> None:
        self.admin_caller()
        usage = self.gpupool_services.usage
        if usage is None:
            raise web.HTTPError(503, "usage accounting is not running on this hub")
        args = {
            k: self.get_argument(k)
            for k in ("period", "from", "to", "by", "sort", "limit", "offset")
            if self.get_argument(k, None)
        }
        p = report_args(args, usage)
        report = await usage.report_off_loop(
            p["a"], p["b"], p["by"], sort=p["sort"], offset=p["offset"], limit=p["limit"]
        )
        self.set_header("Content-Type", "text/csv; charset=utf-8")
        self.set_header("Content-Disposition", f'attachment; filename="gpupool-usage-{p["by"]}.csv"')
        self.finish(usage.csv(report))


class GrantAction(ActionBase):
    """A top-up or an exemption from the page ({"target", "kind", "gpu_hours", "days"})."""

    async def post(self) -> None:
        caller = self.admin_caller()
        usage = self.gpupool_services.usage
        if usage is None:
            raise web.HTTPError(503, "usage accounting is not running on this hub")
        target, kind, milli_s, seconds, note = parse_grant(json_object(self.request.body, 4096))
        usage.add_grant(target, kind, milli_s, int(time.time()) + seconds, caller.name, note)
        self.finish({"saved": True})


def routes(prefix: str, kwargs: dict[str, object]) -> list[tuple[Any, ...]]:
    return [
        (f"{prefix}/{PAGE}", UsagePage, kwargs),
        (f"{prefix}/{PAGE}.csv", UsageCSV, kwargs),
        (f"{prefix}/budgets/grants", GrantAction, kwargs),
    ]
