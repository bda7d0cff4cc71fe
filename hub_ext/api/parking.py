"""Park and resume a workspace's GPU, and its parking state (for the kernel's resume hook,
the status widget and the JupyterLab status item).

    POST api/parking/park    {"server": "", "owner": "ann"}  culler/admin any, a user their own
    POST api/parking/resume  {"server": ""}                  the kernel's hook and the Resume button
    GET  api/parking/status?server=NAME[&owner=ann]          state: none | running | parked |
                                                              waiting | resuming | moving | failed
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tornado import web

from gpupool.api.auth import APIHandler, Caller
from gpupool.gpu.parking import ParkingError
from gpupool.hub.adapter import hub_users
from gpupool.vocab.culler_wire import CullTarget

if TYPE_CHECKING:
    from gpupool.alloc.manager import PoolManager
    from gpupool.hub.adapter import HubApp

MAX_NAME = 255


def parked_targets(pool: PoolManager, app: HubApp | None) -> list[CullTarget]:
    """Parked workspaces for the culler: no GPU to sample, but their time limits still apply
    (an extension of the session too)."""
    from gpupool.api.culler import extended_in

    out: list[CullTarget] = []
    user_of = hub_users(app)
    for p in pool.parked_without_gpu():
        user = user_of(p.owner)
        out.append(
            {
                "owner": p.owner,
                "name": p.name,
                "pid": None,
                "pod_uid": "",
                "server_url": "",
                "gpu_uuids": [],
                "whole_gpus": False,
                "milli": 0,
                "memory_limit_mib": 0,
                "groups": list(p.groups),
                "admin": bool(user.admin) if user else False,
                "extended": extended_in(pool, app, p.owner, p.name),
                "parked": True,
            }
        )
    return out


def _name(value: object, what: str) -> str:
    if not isinstance(value, str) or len(value) > MAX_NAME:
        raise web.HTTPError(400, f"{what} must be a name of at most {MAX_NAME} characters")
    return value


class ParkingHandler(APIHandler):
    @property
    def parking(self):
        service = self.services.parking
        if service is None:
            raise web.HTTPError(503, "parking is not set up on this hub")
        return service

    def target(self, caller: Caller, owner: object, server: object) -> tuple[str, str]:
        """Whose workspace: a user only their own; the culler and admins anyone's."""
        server = _name(server if server is not None else "", "server")
        owner = _name(owner, "owner") if owner not in (None, "") else caller.name
        if owner != caller.name and not caller.sees_all:
            raise web.HTTPError(403, "you may park and resume only your own workspaces")
        return owner, server


class ParkHandler(ParkingHandler):
    @web.authenticated
    async def post(self) -> None:
        caller = self.caller
        body = self.json_body()
        owner, server = self.target(caller, body.get("owner"), body.get("server"))
        try:
            self.write_json(await self.parking.park_async(owner, server))
        except LookupError as err:
            raise web.HTTPError(404, str(err)) from None
        except ValueError as err:
            raise web.HTTPError(409, str(err)) from None
        except ParkingError as err:
            raise web.HTTPError(409, f"could not park: {err}") from None


class ResumeHandler(ParkingHandler):
    @web.authenticated
    def post(self) -> None:
        caller = self.caller
        body = self.json_body()
        owner, server = self.target(caller, body.get("owner"), body.get("server"))
        try:
            claimed = self.parking.claim(owner, server)
        except LookupError as err:
            raise web.HTTPError(404, str(err)) from None
        if claimed["state"] == "failed":  # said once (a kernel lost in a move): not read again
            self.write_json(claimed)
            return
        self.write_json(self.parking.status(owner, server, sees_all=caller.sees_all))


class ParkingStatusHandler(ParkingHandler):
    @web.authenticated
    def get(self) -> None:
        caller = self.caller
        owner, server = self.target(caller, self.get_argument("owner", None), self.get_argument("server", ""))
        self.write_json(self.parking.status(owner, server, sees_all=caller.sees_all))


ROUTES: tuple[tuple[str, type[APIHandler]], ...] = (
    ("api/parking/park", ParkHandler),
    ("api/parking/resume", ResumeHandler),
    ("api/culler/resume", ResumeHandler),  # where the JupyterLab item's Resume button posts
    ("api/parking/status", ParkingStatusHandler),
)
