"""The culling demo's GPU-use switch (`gpupool up --demo-culling`, `c.IdleCuller.sampler = "demo"`).

With no GPU to measure, each user says whether their workspace's GPU is busy or idle; the
culler's demo sampler reads what they said, so warnings, Extend, parking and resume can be tried
in minutes on a laptop. Off (404) on any other hub.

    GET  api/demo/gpu-use                       {"use": {"ann/": "busy"}}: yours (all: culler, admins)
    POST api/demo/gpu-use {"server": "", "busy": true}   your workspace's GPU, busy or idle
"""

from __future__ import annotations

from tornado import web

from gpupool.api.auth import APIHandler

SETTING = "demo-gpu-use"
MAX_NAME = 255


class DemoUseHandler(APIHandler):
    def demo_only(self) -> None:
        if not self.services.demo_gpu_use:
            raise web.HTTPError(
                404, "GPU use is simulated only in the culling demo (gpupool up --demo-culling)"
            )

    @web.authenticated
    def get(self) -> None:
        self.demo_only()
        caller = self.caller
        use = self.pool.store.get_setting(SETTING) or {}
        mine = {k: v for k, v in use.items() if caller.sees_all or k.partition("/")[0] == caller.name}
        self.write_json({"use": mine})

    @web.authenticated
    def post(self) -> None:
        self.demo_only()
        caller = self.caller
        body = self.json_body()
        server, busy = body.get("server", ""), body.get("busy")
        if not isinstance(server, str) or len(server) > MAX_NAME:
            raise web.HTTPError(
                400, f"server must be a server name of at most {MAX_NAME} characters ('' for the default)"
            )
        if not isinstance(busy, bool):
            raise web.HTTPError(400, "busy must be true (the GPU computes) or false (it idles)")
        use = self.pool.store.get_setting(SETTING) or {}
        use[f"{caller.name}/{server}"] = "busy" if busy else "idle"
        self.pool.store.put_setting(SETTING, use)
        self.write_json({"server": server, "use": "busy" if busy else "idle"})


ROUTES: tuple[tuple[str, type[APIHandler]], ...] = (("api/demo/gpu-use", DemoUseHandler),)
