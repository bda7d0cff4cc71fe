"""The running JupyterHub application, as gpupool uses it: the ONLY code that touches the hub's
application object (users, config, log, URLs, spawner class, tornado application).

Everything else talks to `HubApp`'s small typed interface, so what gpupool needs of JupyterHub is
listed in one place, and a test gives a stand-in of these few attributes instead of a whole hub.

Finding a User by name without walking every user: JupyterHub's `name in app.users` walks every
user the hub has loaded (its UserDict is keyed by id): with a class of 5,000, every gpupool request
that asked it paid a walk of 5,000, and the culler's list of targets one walk per workspace (1,000
workspaces: 3 s of a 4 s pass). Here: one indexed read of the hub's database for one name
(`user`), and for a loop over many owners a map built once from the loaded users (`user_lookup`).
"""

from __future__ import annotations

import logging
import signal
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

log = logging.getLogger("gpupool")

if TYPE_CHECKING:
    from jupyterhub.app import JupyterHub
    from jupyterhub.user import User
    from tornado.web import RequestHandler
    from traitlets.config import Config

    from gpupool.contain import WorkloadCgroups


class HubApp:
    """What gpupool reads of, and adds to, the JupyterHub application it runs in."""

    def __init__(self, app: JupyterHub) -> None:
        self._app = app

    @classmethod
    def running(cls) -> HubApp:
        """The hub this process runs (JupyterHub is a traitlets singleton application)."""
        from jupyterhub.app import JupyterHub

        return cls(JupyterHub.instance())

    # --- what it is configured as -------------------------------------------------------------
    @property
    def config(self) -> Config:
        return self._app.config

    @property
    def log(self) -> logging.Logger:
        return self._app.log

    @property
    def base_url(self) -> str:
        """The hub's public base URL ("/", "/jhub/"...)."""
        return str(self._app.base_url)

    @property
    def hub_prefix(self) -> str:
        """Where the hub's own pages are ("/hub/" under the base URL)."""
        return str(self._app.hub_prefix)

    @property
    def api_url(self) -> str:
        """The hub's REST API, as this process reaches it."""
        app = self._app
        ip = app.hub_connect_ip or app.hub_ip or "127.0.0.1"
        return f"http://{ip}:{app.hub_port}{app.base_url.rstrip('/')}/hub/api"

    def on_stop(self, callback: Callable[[str], object]) -> None:
        """Call `callback(signal name)` first when the hub begins to stop (SIGTERM/SIGINT), before
        JupyterHub stops its services and servers: from then on gpupool starts nothing new."""
        app = self._app
        shutdown = app.shutdown_cancel_tasks  # what JupyterHub's signal handlers call, looked up then

        async def stopping(sig: signal.Signals | None = None) -> None:
            try:
                callback(getattr(sig, "name", "a stop"))
            except Exception:  # noqa: BLE001 - the hub must stop whatever gpupool's part says
                log.exception("gpupool's part of the stop failed")
            await shutdown(sig)

        app.shutdown_cancel_tasks = stopping

    # --- its spawner class ---------------------------------------------------------------------
    @property
    def follows_published_gpu(self) -> bool:
        """Its servers run on this machine and read the GPU the hub publishes (local spawners)."""
        return bool(getattr(self._app.spawner_class, "follows_published_gpu", False))

    @property
    def cleans_up_orphans(self) -> bool:
        """Its servers are processes of this machine that may outlive a hub restart."""
        return hasattr(self._app.spawner_class, "cleanup_orphans")

    def cleanup_orphans(self, cgroups: WorkloadCgroups, owner: str, name: str) -> Sequence[int]:
        """End what is left of a workspace the hub does not know as running: the pids ended."""
        cleanup = getattr(self._app.spawner_class, "cleanup_orphans", None)
        return cleanup(cgroups, owner, name) if cleanup is not None else ()

    # --- its users -------------------------------------------------------------------------------
    def user(self, name: str) -> User | None:
        """The hub's User named `name` (None when there is no such user)."""
        try:
            return self._app.users[name]  # by name: one query on the users' unique name index
        except KeyError:
            return None

    def user_lookup(self) -> Callable[[str], User | None]:
        """A lookup for many names at once: the users the hub has loaded, the database for others."""
        loaded = {u.name: u for u in list(self._app.users.values())}
        return lambda name: loaded[name] if name in loaded else self.user(name)

    def groups_of(self, name: str) -> tuple[str, ...]:
        """The user's groups as the hub has them now, sorted (none for an unknown user)."""
        user = self.user(name)
        return tuple(sorted(g.name for g in user.groups)) if user is not None else ()

    def group_map(self) -> dict[str, tuple[str, ...]]:
        """Every user's groups (sorted) in one query of the hub's database; users in no group are
        left out. For work that runs off the loop and must not touch the hub's session."""
        from jupyterhub import orm

        out: dict[str, list[str]] = {}
        for user, group in self._app.db.query(orm.User.name, orm.Group.name).join(orm.User.groups):
            out.setdefault(user, []).append(group)
        return {u: tuple(sorted(g)) for u, g in out.items()}

    def server_active(self, owner: str, name: str) -> bool:
        """Does the hub know a running or starting server `name` of `owner`?"""
        user = self.user(owner)
        spawner = user.spawners.get(name) if user is not None else None
        return bool(spawner and spawner.active)

    # --- what gpupool adds to it -----------------------------------------------------------------
    def add_handlers(self, handlers: list[tuple[str, type[RequestHandler], dict[str, object]]]) -> None:
        """Pages served by the hub's own tornado application (in its look, behind its login)."""
        self._app.tornado_application.add_handlers(".*$", handlers)


def hub_user(hub: HubApp | None, name: str) -> User | None:
    """The hub's User named `name` (None without a hub, or when there is no such user)."""
    return hub.user(name) if hub is not None else None


def hub_users(hub: HubApp | None) -> Callable[[str], User | None]:
    """`HubApp.user_lookup`, or no user at all without a hub."""
    return hub.user_lookup() if hub is not None else (lambda name: None)
