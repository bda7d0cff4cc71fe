"""A Jupyter server extension in each workspace: `<base>/gpupool/status` and `/gpupool/extend` for
the JupyterLab extension (status item, cull warning). The browser never holds a hub token: this
server asks the gpupool API with its own (`JUPYTERHUB_API_TOKEN`, `GPUPOOL_API_URL`), and only the
logged-in user of this server reaches these handlers (jupyter_server's own authentication).

Enabled by `etc/jupyter/jupyter_server_config.d/gpupool.json`, installed with the package."""

from __future__ import annotations

import asyncio
import json
import os
import time
from typing import Any

from jupyter_server.base.handlers import APIHandler
from jupyter_server.utils import url_path_join
from tornado import web

from gpupool.widgets.client import Client, GPUPoolError
from gpupool.widgets.summary import summary


def server_name() -> str:
    return os.environ.get("JUPYTERHUB_SERVER_NAME", "")


def read_status(client: Client, now: float) -> dict[str, Any]:
    """The summary the status item shows; the culler's findings are optional (none before its first pass)."""
    me = client.get("api/me")
    pool = client.get("api/pool")
    try:
        culler = client.get("api/culler/status")
    except GPUPoolError:
        culler = None
    return summary(
        me,
        pool,
        culler,
        server_name(),
        now,
        budget=_optional(client, "api/budget"),
        jobs=_optional(client, "api/jobs?state=queued"),
    )


def _optional(client: Client, path: str) -> Any:
    """What a hub without that part (no budgets, no training pool) does not answer: None."""
    try:
        return client.get(path)
    except GPUPoolError:
        return None


class _Handler(APIHandler):
    # reading the GPU share is no user activity: the status item and %gpupool poll these, and the
    # idle culler must still find Jupyter quiet (jupyter_server counts every other API request)
    _track_activity = False

    async def call(self, fn, *args: Any) -> None:
        try:
            client = Client(timeout=8)
            # urllib blocks: keep it off the server's event loop
            result = await asyncio.get_running_loop().run_in_executor(None, fn, client, *args)
        except GPUPoolError as err:
            self.set_status(err.status if 400 <= err.status < 500 else 502)
            result = {"error": str(err)}
        self.set_header("Content-Type", "application/json")
        self.finish(json.dumps(result))


class StatusHandler(_Handler):
    @web.authenticated
    async def get(self) -> None:
        await self.call(read_status, time.time())


class WorkspaceHandler(_Handler):
    """What %gpupool shows (gpupool.widgets.status.workspace_view), for its view in JupyterLab."""

    @web.authenticated
    async def get(self) -> None:
        from gpupool.widgets.status import workspace_view

        await self.call(lambda client: workspace_view(client, server_name(), os.environ, time.time()))


class ExtendHandler(_Handler):
    _track_activity = True  # pressing Extend is the user at work

    @web.authenticated
    async def post(self) -> None:
        await self.call(lambda client: client.post("api/culler/extend", {"server": server_name()}))


class ResumeHandler(_Handler):
    """For GPU parking: resume this server's parked share."""

    _track_activity = True

    @web.authenticated
    async def post(self) -> None:
        await self.call(lambda client: client.post("api/parking/resume", {"server": server_name()}))


def _jupyter_server_extension_points() -> list[dict[str, str]]:
    return [{"module": "gpupool.widgets.labserver"}]


def _load_jupyter_server_extension(server_app: Any) -> None:
    from gpupool.widgets.quiet import untrack

    untrack(server_app.kernel_manager)  # widgets' own refreshes are no user activity (gpupool.widgets.quiet)
    web_app = server_app.web_app
    base = url_path_join(web_app.settings["base_url"], "gpupool")
    web_app.add_handlers(
        ".*$",
        [
            (url_path_join(base, "status"), StatusHandler),
            (url_path_join(base, "workspace"), WorkspaceHandler),
            (url_path_join(base, "extend"), ExtendHandler),
            (url_path_join(base, "resume"), ResumeHandler),
        ],
    )
