"""The page behind the hub home's "Extend" link: a browser confirms the one extension of a
workspace with a form (the gpupool service's OAuth cookie and JupyterHub's XSRF token), then
returns to the hub. The notebook widget uses the JSON endpoint instead. The markup is
templates/gpupool-extend.html."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from tornado import web

from gpupool.api.auth import BaseHandler
from gpupool.api.culler import extend_workspace
from gpupool.hub.templating import render


class ExtendPage(BaseHandler):
    def page(
        self, status: int = 200, *, server: str = "", warning: str = "", error: str | None = None
    ) -> None:
        self.set_status(status)
        self.finish(
            render(
                "gpupool-extend.html",
                home=self.hub_auth.hub_prefix + "home",
                server=server,
                warning=warning,
                error=error,
                xsrf=self.xsrf_token.decode(),
            )
        )

    @web.authenticated
    def get(self) -> None:
        name = self.get_argument("server", "")
        found: Mapping[str, Any] = self.services.culler["workspaces"].get(f"{self.caller.name}/{name}") or {}
        self.page(server=name, warning=found.get("message") or "")

    @web.authenticated
    def post(self) -> None:
        name = self.get_argument("server", "")
        try:
            extend_workspace(
                self.services, self.pool, self.caller.name, self.caller.name, name, self.directory.hub
            )
        except web.HTTPError as err:
            self.page(err.status_code, server=name, error=err.log_message or "")
            return
        self.redirect(self.hub_auth.hub_prefix + "home")
