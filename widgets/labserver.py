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

from jupyter_server.base.handlers import APIHandler, JupyterHandler
from jupyter_server.utils import url_path_join
from tornado import web

from gpupool.vocab.hibernate_wire import (
    HibernateAnswer,
    KernelSaved,
    SavedSummary,
    kernel_saved,
    saved_summary,
)
from gpupool.widgets.client import Client, GPUPoolError
from gpupool.widgets.hibernation import asked_hub, hibernation
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
    return {
        **summary(
            me,
            pool,
            culler,
            server_name(),
            now,
            budget=_optional(client, "api/budget"),
            jobs=_optional(client, "api/jobs?state=queued"),
        ),
        # JupyterLab offers "Hibernate now" (the item's click, the palette) only where it is on
        "hibernate": hibernation(client, server_name())[0],
    }


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

    async def call(self, fn, *args: object) -> None:
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


HIBERNATE_EXPR = (
    "__import__('gpupool.gpu.hibernate', fromlist=['save_shell'])"
    ".save_json(get_ipython(), {cap}, {quota}, {keep})"
)


def _bounded_int(value: object, top: int) -> int:
    return value if type(value) is int and 0 <= value <= top else 0


class HibernateHandler(APIHandler):
    """POST: save the variables of each of this server's kernels to the user's home (run in the
    kernels, as the user; gpupool.gpu.hibernate). The culler calls it before it stops the server
    (its token's access:servers scope); `%gpupool hibernate` saves its own kernel first and asks
    for the others. Body (all optional): {"cap_bytes", "quota_bytes", "keep_days", "except": [kernel
    ids]}. Answer: {"ok": all saved, "kernels": [{"id", "ok", "bytes", "variables", "skipped",
    "error"}], "bytes"}."""

    @web.authenticated
    async def post(self) -> None:
        try:
            body = json.loads(self.request.body or b"{}")
        except ValueError:
            body = None
        if not isinstance(body, dict):
            raise web.HTTPError(400, "the body must be a JSON object")
        expr = HIBERNATE_EXPR.format(
            cap=_bounded_int(body.get("cap_bytes"), 1 << 50),
            quota=_bounded_int(body.get("quota_bytes"), 1 << 50),
            keep=_bounded_int(body.get("keep_days"), 36500),
        )
        skip = (
            [k for k in body["except"] if isinstance(k, str)] if isinstance(body.get("except"), list) else []
        )
        timeout = float(_bounded_int(body.get("timeout_s"), 3600) or 600)
        result = await hibernate_all(self.kernel_manager, expr, timeout, skip)
        self.set_header("Content-Type", "application/json")
        self.finish(json.dumps(result))


async def hibernate_all(kernel_manager: Any, expr: str, timeout: float, skip: list[str]) -> HibernateAnswer:
    """Run the saver in each of this server's kernels but `skip`."""
    kernels: list[KernelSaved] = []
    for kid in list(kernel_manager.list_kernel_ids()):
        if kid in skip:
            continue
        kernels.append({**await hibernate_kernel(kernel_manager.get_kernel(kid), expr, timeout), "id": kid})
    return {
        "ok": all(k["ok"] for k in kernels),
        "kernels": kernels,
        "bytes": sum(k.get("bytes", 0) for k in kernels),
    }


# the home page's "Hibernate now": what the culler's hibernation saves (its defaults; the kernel
# does not see the hub's config)
NOW_EXPR = HIBERNATE_EXPR.format(cap=8 << 30, quota=32 << 30, keep=0)
NOW_PAGE = """<!doctype html><html><head><meta charset="utf-8"><title>Hibernate</title></head>
<body style="font-family:sans-serif;max-width:40em;margin:3em auto">
<h1>Hibernate this server</h1><p>{text}</p>{form}<p><a href="{home}">Back to the hub</a></p></body></html>"""


class HibernateNowPage(JupyterHandler):
    """The hub home page's "Hibernate now" (a link to this page of the user's own server; the
    server's own login and XSRF check), and JupyterLab's (which asks for JSON): GET confirms, POST saves every kernel as the culler's
    hibernation does, records it in the hub with this server's own token (the home page and the
    admins' list show it), then stops this server, which frees its GPU share. Nothing is stopped
    unless every kernel was saved."""

    def page(self, text: str, form: bool = False, status: int = 200) -> None:
        from html import escape

        home = os.environ.get("JUPYTERHUB_BASE_URL", "/").rstrip("/") + "/hub/home"
        button = (
            f'<form method="post">{self.xsrf_form_html()}<button type="submit">Hibernate now</button></form>'
            if form
            else ""
        )
        self.set_status(status)
        if "application/json" in self.request.headers.get("Accept", ""):
            # JupyterLab's "Hibernate now" command (labextension/src/hibernate.js) shows the words
            self.finish({"ok": status < 400, "message": text})
            return
        self.finish(NOW_PAGE.format(text=escape(text), form=button, home=escape(home)))

    async def refused(self) -> bool:
        """Where the hub says hibernation is off for this user (or cannot say), the page says so,
        with 403, before anything is saved or stopped: whatever JupyterLab or the home page offer."""
        on, why = await asyncio.to_thread(asked_hub)
        if not on:
            self.page(f"{why[:1].upper()}{why[1:]}. Nothing was saved or stopped.", status=403)
        return not on

    @web.authenticated
    async def get(self) -> None:
        if await self.refused():
            return
        n = len(list(self.kernel_manager.list_kernel_ids()))
        self.page(
            f"The variables of this server's {n} kernel{'' if n == 1 else 's'} are saved to your home,"
            " then the server stops and its GPU share is freed. They come back when you start it"
            " and open the notebook.",
            form=True,
        )

    @web.authenticated
    async def post(self) -> None:
        from gpupool.gpu.hibernate import _post_own_server, _record_in_hub, _size

        if await self.refused():
            return
        result = await hibernate_all(self.kernel_manager, NOW_EXPR, 600.0, [])
        kernels = result.get("kernels", [])
        failed = [k for k in kernels if not k["ok"]]
        if failed:
            self.page(
                f"{len(failed)} kernel(s) could not be saved ({str(failed[0].get('error'))[:200]});"
                " nothing was stopped.",
                status=409,
            )
            return
        hibernated = saved_summary(kernels) or SavedSummary(bytes=0, kernels=0, notebooks=[])
        note = ""
        if os.environ.get("GPUPOOL_API_URL"):
            try:
                await asyncio.to_thread(
                    _record_in_hub, {"server": server_name(), "hibernated": hibernated}, os.environ
                )
            except (OSError, ValueError) as err:
                note = f" (the hub did not record it: {err}; your variables are saved all the same)"
        self.page(
            f"Hibernated {len(kernels)} kernel{'' if len(kernels) == 1 else 's'} ({_size(result['bytes'])});"
            f" this server stops now{note}. Your variables come back when you start it and open the notebook."
        )

        def stop() -> None:  # jupyter_server's own /api/shutdown, as %gpupool hibernate asks it
            try:
                _post_own_server("api/shutdown", {}, os.environ, 5.0)
            except (OSError, ValueError):
                pass  # no answer is the normal case: the server stops while answering

        asyncio.get_running_loop().run_in_executor(None, stop)


async def hibernate_kernel(km: Any, expr: str, timeout: float) -> KernelSaved:
    """Run the saver in one kernel (silently, no history) and read its summary back."""
    import ast

    from jupyter_core.utils import ensure_async  # jupyter_server's own: a plain value or an awaitable

    client = km.client()
    client.start_channels()
    try:
        # a kernel just started (the notebook opened, not woken yet) may not have joined IOPub:
        # execute_interactive then misses the idle status and waits its whole timeout. Ready first.
        await ensure_async(client.wait_for_ready(timeout=min(timeout, 120.0)))
        reply = await ensure_async(  # jupyter_server's clients are async ones
            client.execute_interactive(
                "",
                silent=True,
                store_history=False,
                user_expressions={"r": expr},
                timeout=timeout,
                output_hook=lambda msg: None,
            )
        )
        result = reply["content"].get("user_expressions", {}).get("r", {})
        if result.get("status") != "ok":
            return {
                "ok": False,
                "error": f"{result.get('ename', 'error')}: {str(result.get('evalue'))[:200]}",
            }
        summary = kernel_saved(json.loads(ast.literal_eval(result["data"]["text/plain"])))
        return summary if summary is not None else {"ok": False, "error": "no summary"}
    except Exception as err:  # noqa: BLE001 - a kernel that died or timed out: not hibernated
        return {"ok": False, "error": f"{type(err).__name__}: {str(err)[:200]}"}
    finally:
        client.stop_channels()


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
            (url_path_join(base, "hibernate"), HibernateHandler),
            (url_path_join(base, "hibernate-now"), HibernateNowPage),
        ],
    )
