"""`gpupool up --demo-culling`: the idle culler and GPU parking on a laptop in minutes. GPU use is
what the user says (idle unless said otherwise), an idle GPU is parked after 2 min and comes back
on use, a session is warned before its 8 min end, extended once, stopped, and the hub's home page
says why ("stopped at 14:08: it reached the longest session allowed"; before, only "Server not
running").

The hub is `gpupool up --demo-culling`; the culler runs here with the demo's own settings and a
travelled clock (10 s steps, as its passes come), reading the user's say through the hub."""

from __future__ import annotations

import json
import re

import pytest

from gpupool.idle_culler.config import IdleCuller
from gpupool.idle_culler.sampler import make_sampler
from gpupool.idle_culler.service import Client, Culler, parse_time, service_definition
from gpupool.widgets.client import Client as WidgetClient
from gpupool.widgets.magics import demo_gpu_use
from gpupool.wiring.embedded import DEMO_CULLING, DEMO_CULLING_NOTE
from tests.hubtools import PASSWORD, Hub, WebUser
from tests.support.wait import until

pytestmark = pytest.mark.hub
TOKEN = "test-culler-token-0123456789abcdef"
SETTINGS = DEMO_CULLING["IdleCuller"]
_, ROLE = service_definition("test-culler", "", SETTINGS)
CONFIG = f"""
c.JupyterHub.services.append({{"name": "test-culler", "api_token": "{TOKEN}"}})
c.JupyterHub.load_roles.append({json.dumps({**ROLE, "name": "test-culler", "services": ["test-culler"]})})
c.GPUParking.virtual_fixed_s = 0.05
c.GPUParking.virtual_per_gib_s = 0.0
"""
P = "/services/gpupool/api"


def test_the_demo_parks_resumes_warns_extends_stops_and_says_why(make_hub) -> None:
    hub: Hub = make_hub(CONFIG, env={"GPUPOOL_CULLER": "0"}, up_args=["--demo-culling"]).start()
    assert DEMO_CULLING_NOTE in hub.tail(400)  # the banner says what the demo does
    hub.spawn("dora", "0.25")
    dora = hub.user_token("dora")
    hub.api("POST", "/user/dora/api/kernels", {"name": "python3"}, token=dora)
    api = f"http://127.0.0.1:{hub.api_port}/services/gpupool/"
    client = Client(TOKEN)
    culler = Culler(
        IdleCuller(**SETTINGS),
        client,
        f"{hub.url}/hub/api",
        api,
        make_sampler("demo", read=lambda path: client.call("GET", api + path)),
        clock=lambda: now[0],
    )
    started = parse_time(hub.api("GET", "/hub/api/users/dora")["servers"][""]["started"])
    now = [started]
    events: list[tuple[float, dict]] = []

    def passes_until(second: float) -> list[dict]:
        new = []
        while now[0] < started + second:
            now[0] += 10
            new += [e for e in culler.run_pass()["events"]]
        events.extend((now[0] - started, e) for e in new)
        return new

    # nobody said anything: the GPU counts as idle, and is parked after 2 minutes
    assert [e["kind"] for e in passes_until(110)] == []
    parked = passes_until(140)
    assert [(e["kind"], e["owner"]) for e in parked] == [("park", "dora")], events
    assert hub.api("GET", f"{P}/parking/status?server=", token=dora)["state"] == "parked"
    # a cell (its resume hook), or the Resume button: the GPU comes back
    hub.api("POST", f"{P}/parking/resume", {"server": ""}, token=dora)
    until(
        lambda: hub.api("GET", f"{P}/parking/status?server=", token=dora)["state"] == "running",
        "dora's workspace resumed",
    )
    # %gpupool gpu busy: the GPU computes, so nothing parks it
    said = demo_gpu_use(["busy"], client=WidgetClient(api, dora))
    assert said.startswith("this workspace's GPU now counts as busy"), said
    assert hub.api("GET", f"{P}/demo/gpu-use", token=dora) == {"use": {"dora/": "busy"}}
    assert [e["kind"] for e in passes_until(230)] == []
    # 4 minutes before the 8-minute end: warned, with the extension still to take
    [warn] = passes_until(250)
    assert warn["kind"] == "warn" and "reached the maximum session length" in warn["message"]
    assert "(you may extend once)" in warn["message"]
    hub.api("POST", f"{P}/culler/extend", {"server": ""}, token=dora)
    assert [e["kind"] for e in passes_until(530)] == []  # 5 minutes more
    hub.api("POST", f"{P}/demo/gpu-use", {"server": "", "busy": False}, token=dora)  # done computing
    stopped = [e for e in passes_until(800) if e["kind"] == "cull"]
    assert [e["owner"] for e in stopped] == ["dora"], events
    until(lambda: not hub.api("GET", "/hub/api/users/dora")["servers"], "dora's server stopped")

    # the home page says when and why, until the server is started again
    user = WebUser(hub.url, "dora")
    user.log_in(PASSWORD)
    _, _, home = user.get("/hub/home")
    assert re.search(
        r"was stopped at \d\d:\d\d: it reached the longest session allowed\. Start it again when"
        r" you need it\.",
        home,
    ), home[-3000:]
    hub.spawn("dora", "0.25")
    _, _, home = user.get("/hub/home")
    assert "gpupool-stopped" not in home


def test_outside_the_demo_gpu_use_is_measured_not_said(hub: Hub) -> None:
    from gpupool.widgets.magics import demo_gpu_use

    client = WidgetClient(f"http://127.0.0.1:{hub.api_port}/services/gpupool/", hub.user_token("nemo"))
    assert "only in the culling demo (gpupool up --demo-culling)" in demo_gpu_use(["busy"], client=client)
    assert demo_gpu_use(["maybe"], client=client).startswith("%gpupool gpu busy (the GPU computes)")
