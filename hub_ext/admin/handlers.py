"""The admin page's handlers: built on JupyterHub's own BaseHandler and rendered with its
`render_template`, so the page extends the hub's `page.html` (its navigation, user menu and
theme) and checks the hub's login cookie and XSRF token like every hub page.

They are added to the hub's tornado application once it exists (tornado's public
`Application.add_handlers`); `c.JupyterHub.extra_handlers` would do the same but is deprecated
and logs a warning on every start.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from jupyterhub.handlers import BaseHandler
from tornado import web

from gpupool.admin.view import admin_view
from gpupool.api.auth import Caller, json_object
from gpupool.api.quotas import (
    QuotaRefused,
    change_quotas,
    gpus_amount,
    group_quota_change,
    group_removal,
    group_total_change,
    notes,
)
from gpupool.pool.units import UnitError, format_gpus, parse_gpus, shown
from gpupool.vocab.states import UNFINISHED

if TYPE_CHECKING:
    from gpupool.api.auth import ApiRoot
    from gpupool.api.services import ApiServices
    from gpupool.hub.adapter import HubApp

PAGE_PATH = "gpupool"  # under the hub's prefix: /hub/gpupool
MAX_ACTION_BYTES = 4096  # a quota or a job id, never more


class AdminBase(BaseHandler):
    def initialize(self, services: ApiServices, root: ApiRoot) -> None:
        # not `services`/`root`: JupyterHub's BaseHandler has a `services` property of its own
        self.gpupool_services = services  # the gpupool API's (gpupool.api.services)
        self.gpupool_root = root

    def admin_caller(self) -> Caller:
        """The signed-in hub admin (the rule the gpupool API uses: the hub's admin flag)."""
        user = self.current_user
        if user is None:
            raise web.HTTPError(403, "sign in to the hub first")
        if not user.admin:
            raise web.HTTPError(
                403, "the GPU pool page is for hub admins; your GPU shares are on the home page"
            )
        return Caller(
            name=user.name, kind="user", admin=True, groups=tuple(sorted(g.name for g in user.groups))
        )


class AdminPage(AdminBase):
    @web.authenticated
    async def get(self) -> None:
        caller = self.admin_caller()
        html = await self.render_template(
            "gpupool-admin.html",
            admin_access=True,
            **admin_view(self.gpupool_services, self.gpupool_root, caller),
        )
        self.finish(html)


class ActionBase(AdminBase):
    """JSON in, JSON out: {"message"} on an error, shown in the page as it is."""

    def body(self) -> dict[str, Any]:
        return json_object(self.request.body, MAX_ACTION_BYTES)

    def write_error(self, status_code: int, **kwargs: Any) -> None:
        exc = kwargs.get("exc_info", (None, None, None))[1]
        message = getattr(exc, "log_message", None) or self._reason
        self.set_header("Content-Type", "application/json")
        self.finish(json.dumps({"status": status_code, "message": str(message)[:500]}))


class QuotaAction(ActionBase):
    """Change the default build quota ({"default_build_quota": 0.5}), one group's quota per member
    ({"group": "class-a", "quota": 0.5}), what a group holds together ({"group": "class-a",
    "total": 2}, "" for no ceiling), or forget a group's row ({"group": "class-a", "remove": true});
    validated as the config file and the API are, answered in plain words with what the change
    means when it shuts people out ({"saved": true, "notes": [...]})."""

    async def post(self) -> None:
        caller = self.admin_caller()
        body = self.body()
        root = self.gpupool_root
        pool = root.pool
        try:
            keys = set(body)
            if keys == {"group", "quota"}:
                change = group_quota_change(root, body["group"], body["quota"])
                what = f"set group {body['group']}'s build quota to {amount(body['quota'])}"
            elif keys == {"group", "total"}:
                change = group_total_change(root, body["group"], body["total"])
                what = (
                    f"set group {body['group']}'s total to {amount(body['total'])}"
                    if body["total"] not in ("", None)
                    else f"took group {body['group']}'s total away"
                )
            elif keys == {"group", "remove"} and body["remove"] is True:
                change = group_removal(root, body["group"])
                what = f"removed group {body['group']}'s own quota and total"
            elif keys == {"default_build_quota"}:
                change = {
                    "default_build_quota": gpus_amount(body["default_build_quota"], "the default build quota")
                }
                what = f"set the default build quota to {amount(body['default_build_quota'])}"
            else:
                raise QuotaRefused(
                    "send default_build_quota; or group with quota, total or remove;"
                    f" got {shown(sorted(body))}"
                )
            change_quotas(root, caller.name, change, what)
        except QuotaRefused as err:
            raise web.HTTPError(400, str(err)) from None
        self.finish({"saved": True, "notes": notes(pool)})


def amount(value: object) -> str:
    """A quota for the event log: '0.5 GPU' (or the value as given; the change is refused then)."""
    try:
        return format_gpus(parse_gpus(value))
    except UnitError:
        return shown(value)


class CancelAction(ActionBase):
    async def post(self, job_id: str) -> None:
        admin = self.admin_caller()
        training = self.gpupool_services.training
        if training is None:
            raise web.HTTPError(503, "the training pool is not running on this hub")
        row = training.job(job_id)
        if row is None:
            raise web.HTTPError(404, f"no job {shown(job_id)}")
        if row.state not in UNFINISHED:
            raise web.HTTPError(409, f"job {job_id} already {row.state}")
        row = await training.cancel(job_id, by=admin.name)  # the owner reads who cancelled it
        self.finish({"id": row.id, "state": row.state})


def register(hub: HubApp, services: ApiServices, root: ApiRoot) -> None:
    """Add the page and its actions to the running hub's tornado application."""
    prefix = f"{hub.hub_prefix.rstrip('/')}/{PAGE_PATH}"
    kwargs = {"services": services, "root": root}
    from gpupool.admin.usage_page import routes as usage_routes

    hub.add_handlers(
        [
            (prefix, AdminPage, kwargs),
            (f"{prefix}/quotas", QuotaAction, kwargs),
            (f"{prefix}/jobs/([A-Za-z0-9._-]{{1,32}})/cancel", CancelAction, kwargs),
            *usage_routes(prefix, kwargs),  # /hub/gpupool/usage: where the GPU-hours go
        ],
    )
