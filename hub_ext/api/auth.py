"""Who is calling: JupyterHub OAuth (browser) or a hub token (notebooks, services).

The API runs inside the hub process, so admin flags and groups are read from the
hub's own database instead of trusting anything the caller sends.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from jupyterhub.services.auth import HubOAuthCallbackHandler, HubOAuthenticated, UserNotAllowed
from tornado import httputil, web

from gpupool.hub.adapter import hub_user, hub_users
from gpupool.hub.root_key import stored_root
from gpupool.store.db import bounded
from gpupool.vocab.disk import disk_full

if TYPE_CHECKING:
    from traitlets.config import Config

    from gpupool.alloc.manager import PoolManager
    from gpupool.api.services import ApiServices
    from gpupool.contain import WorkloadCgroups
    from gpupool.hub.adapter import HubApp
    from gpupool.settings.config import GPUPool

SERVICES_KEY = "gpupool_services"  # where the API app's settings hold its ApiServices
MAX_DEPTH = 32  # a notebook is 5 levels deep; 32 leaves room and stops a nesting bomb early


class ApiRoot(Protocol):
    """What the gpupool API's handlers and pages read of the hub's composition root
    (gpupool.wiring.root.GPUPoolHub, which sits above them: they do not import it). The root hands
    itself to `make_app` (gpupool.api.app), where mypy checks that it gives all of this."""

    @property
    def config(self) -> Config: ...

    @property
    def settings(self) -> GPUPool: ...

    @property
    def pool(self) -> PoolManager: ...

    @property
    def cgroups(self) -> WorkloadCgroups: ...

    @property
    def hub(self) -> HubApp | None:
        """None before the hub serves."""
        ...

    @property
    def api_services(self) -> ApiServices | None:
        """None before the gpupool API runs."""
        ...


@dataclass(frozen=True)
class Caller:
    name: str
    kind: str  # user | service
    admin: bool
    groups: tuple[str, ...]
    reads_servers: bool = False  # a service allowed to read every server (the culler)

    @property
    def sees_all(self) -> bool:
        return self.admin or self.reads_servers


class Directory:
    """Answers 'is this user an admin, in which groups' from the hub's database."""

    def __init__(self, hub: HubApp | None = None) -> None:
        self.hub = hub

    def caller(self, model: dict[str, Any]) -> Caller:
        name, kind = model["name"], model.get("kind", "user")
        admin, groups = bool(model.get("admin")), tuple(model.get("groups") or ())
        app = self.hub
        user = hub_user(app, name) if kind == "user" else None
        if user is not None:
            admin, groups = bool(user.admin), tuple(sorted(g.name for g in user.groups))
        elif kind == "service":
            # a service is an admin here only if the hub gave it admin rights over servers
            admin = "admin:servers" in (model.get("scopes") or ())
        scopes = set(model.get("scopes") or ())
        reads = kind == "service" and bool({"read:servers", "admin:servers"} & scopes)
        return Caller(name=name, kind=kind, admin=admin, groups=groups, reads_servers=reads)

    def groups_of(self, names: set[str]) -> dict[str, tuple[str, ...]] | None:
        """Each of these users' groups as the hub has them now (None without the hub: callers
        fall back to the groups recorded at each spawn)."""
        app = self.hub
        if app is None:
            return None
        find = hub_users(app)  # not `n in app.users`: a walk of every loaded user per name
        return {n: tuple(sorted(g.name for g in u.groups)) for n in names if (u := find(n)) is not None}


class _OurHubAuth:
    """Use the HubOAuth built for this app (JupyterHub's mixin otherwise takes a
    process-wide singleton configured from environment variables, which the hub
    process does not have)."""

    settings: dict[str, Any]  # the handler's (tornado.web.RequestHandler), which this mixes into

    @property
    def hub_auth(self):
        return self.settings["hub_auth"]

    @hub_auth.setter
    def hub_auth(self, value) -> None:  # the mixin may try to set it; ours is fixed
        pass


class OAuthCallback(_OurHubAuth, HubOAuthCallbackHandler):
    pass


class BaseHandler(_OurHubAuth, HubOAuthenticated, web.RequestHandler):
    async def prepare(self) -> None:
        # Identify the caller without blocking: this API lives in the hub process, and
        # the mixin's synchronous lookup would wait on the very loop that must answer it.
        # Tornado lets prepare() set current_user, so the mixin's own lookup never runs.
        model = await self.hub_auth.get_user(self, sync=False)
        try:
            self.current_user = self.check_hub_user(model) if model else None
        except UserNotAllowed:
            self.current_user = None

    @property
    def root(self) -> ApiRoot:
        """The hub side's composition root (gpupool.wiring.root), from this app's settings."""
        root: ApiRoot = stored_root(self.settings)
        return root

    @property
    def services(self) -> ApiServices:
        """The running services and the state the handlers share (gpupool.api.services)."""
        return self.settings[SERVICES_KEY]

    @property
    def pool(self) -> PoolManager:
        return self.services.pool

    @property
    def directory(self) -> Directory:
        return self.services.directory

    @property
    def caller(self) -> Caller:
        # a handler lives for one request: ask the hub's database once, not at every use
        if self._caller is None:
            model = self.current_user
            if model is None:
                raise web.HTTPError(403)
            self._caller = self.directory.caller(model)
        return self._caller

    _caller: Caller | None = None


class APIHandler(BaseHandler):
    """JSON in, JSON out; errors as {"status", "message"} with no redirects."""

    max_body = 64 * 1024  # bytes of a request body: larger is a 413 before the handler runs (api/bodies.py)

    def get_login_url(self) -> str:
        raise web.HTTPError(403, "authenticate with a JupyterHub token (Authorization: token ...)")

    def json_body(self, max_bytes: int | None = None, max_depth: int = MAX_DEPTH) -> dict[str, object]:
        return json_object(self.request.body, max_bytes or self.max_body, max_depth)

    def write_json(self, data: Any, status: int = 200) -> None:
        self.set_status(status)
        self.set_header("Content-Type", "application/json")
        self.finish(json.dumps(data, default=str))

    # XSRF: JupyterHub's own rule (HubAuthenticated.check_xsrf_cookie) — skipped only for a request a
    # valid token authenticated, checked for every cookie-authenticated one, whatever headers it has

    def send_error(self, status_code: int = 500, **kwargs: Any) -> None:
        exc = kwargs.get("exc_info", (None, None, None))[1]
        if status_code == 500 and disk_full(exc):
            status_code = 507
        super().send_error(status_code, **kwargs)

    def write_error(self, status_code: int, **kwargs: Any) -> None:
        exc = kwargs.get("exc_info", (None, None, None))[1]
        if disk_full(exc):
            changed = "; ".join(getattr(exc, "__notes__", ())) or "nothing was changed"
            message = f"the disk is full: {disk_full(exc)}; {changed} (tell an admin)"
        else:
            message = str(getattr(exc, "log_message", None) or httputil.responses.get(status_code, "error"))
        self.set_header("Content-Type", "application/json")
        self.finish(json.dumps({"status": status_code, "message": bounded(message, MAX_ERROR)}))


def noted(err: BaseException) -> str:
    """An error's words with the notes added to it on its way (what could not be undone)."""
    return "; ".join([str(err), *getattr(err, "__notes__", ())])


MAX_ERROR = 1000  # characters of an error message: a hostile value is quoted only in part


def json_object(raw: bytes, max_bytes: int = 64 * 1024, max_depth: int = MAX_DEPTH) -> dict[str, object]:
    """A request body's JSON object, bounded in size and nesting depth: a 400 or 413 with the
    reason, never a 500 (Python's parser raises RecursionError on a nesting bomb)."""
    if len(raw) > max_bytes:
        raise web.HTTPError(413, f"request body over {max_bytes} bytes")
    try:
        body = json.loads(raw or b"{}")
    except RecursionError:
        raise web.HTTPError(400, f"body is nested deeper than {max_depth} levels") from None
    except ValueError as err:
        raise web.HTTPError(400, bounded(f"body is not JSON: {err}")) from None
    if not isinstance(body, dict):
        raise web.HTTPError(400, "body must be a JSON object")
    if _depth(body, max_depth) > max_depth:
        raise web.HTTPError(400, f"body is nested deeper than {max_depth} levels")
    return body


def _depth(value: object, stop: int) -> int:
    """Nesting depth of parsed JSON, without recursion; stops counting past `stop`."""
    deepest, todo = 0, [(value, 1)]
    while todo:
        v, d = todo.pop()
        if isinstance(v, dict | list):
            deepest = max(deepest, d)
            if d > stop:
                return d
            todo.extend((c, d + 1) for c in (v.values() if isinstance(v, dict) else v))
    return deepest
