"""The page behind the hub home's "Extend" link: a browser confirms the one extension of a
workspace with a form (the gpupool service's OAuth cookie and JupyterHub's XSRF token), then
returns to the hub. The notebook widget uses the JSON endpoint instead."""

from __future__ import annotations

from html import escape

from tornado import web

from gpupool.api.auth import BaseHandler
from gpupool.api.culler import culler_state, extend_workspace

STYLE = "<style>body{font-family:sans-serif;margin:2em}button{font-size:1em;padding:4px 12px}</style>"


class ExtendPage(BaseHandler):
    def page(self, body: str, status: int = 200) -> None:
        self.set_status(status)
        home = escape(self.hub_auth.hub_prefix + "home")
        self.finish(f"<!doctype html><html><head><title>gpupool: extend</title>{STYLE}</head><body>"
                    f"{body}<p><a href='{home}'>Back to the hub</a></p></body></html>")

    @web.authenticated
    def get(self) -> None:
        name = self.get_argument("server", "")
        found = culler_state(self.settings)["workspaces"].get(f"{self.caller.name}/{name}") or {}
        label = escape(name or "your default server")
        warning = f"<p class='gpupool-warning'>{escape(found['message'])}</p>" if found.get("message") else ""
        self.page(f"<h1>Extend {label}</h1>{warning}"
                  "<p>Each session may be extended once.</p>"
                  f"<form method='post'><input type='hidden' name='_xsrf' value='{escape(self.xsrf_token.decode())}'>"
                  f"<input type='hidden' name='server' value='{escape(name)}'>"
                  "<button id='gpupool-extend' type='submit'>Extend</button></form>")

    @web.authenticated
    def post(self) -> None:
        name = self.get_argument("server", "")
        try:
            extend_workspace(self.settings, self.pool, self.caller.name, self.caller.name, name,
                             self.directory.hub_app)
        except web.HTTPError as err:
            self.page(f"<h1>Not extended</h1><p class='gpupool-error'>{escape(err.log_message or '')}</p>",
                      err.status_code)
            return
        self.redirect(self.hub_auth.hub_prefix + "home")
