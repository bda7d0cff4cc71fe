"""The culler against a real hub: GPU use from a file standing in for NVML, time travelled
through the culler's clock and the hub's activity API — no sleeping."""

from __future__ import annotations

import datetime as dt
import html
import json
import re
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from traitlets import TraitError

from gpupool.idle_culler.config import IdleCuller
from gpupool.idle_culler.sampler import FileSampler
from gpupool.idle_culler.service import Client, Culler, service_definition
from tests.hubtools import PASSWORD, Hub, WebUser
from tests.support.wait import until

pytestmark = pytest.mark.hub
TOKEN = "test-culler-token-0123456789abcdef"
_, ROLE = service_definition("test-culler", "", {"memory_resolver": "restart-kernel"})
CONFIG = f"""
c.JupyterHub.services.append({{"name": "test-culler", "api_token": "{TOKEN}"}})
c.JupyterHub.load_roles.append({json.dumps({**ROLE, "name": "test-culler", "services": ["test-culler"]})})
"""


def iso(t: float) -> str:
    return dt.datetime.fromtimestamp(t, dt.UTC).isoformat().replace("+00:00", "Z")


def parse_iso(text: str) -> float:
    return dt.datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def page_of(hub: Hub, user: str, path: str) -> tuple[int, str]:
    """(status, text without tags) of a hub page as the user's browser gets it (a token of theirs
    where the browser has its cookie), redirects followed."""
    req = urllib.request.Request(hub.url + path, headers={"Authorization": f"token {hub.user_token(user)}"})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            status, body = r.status, r.read().decode()
    except urllib.error.HTTPError as err:
        status, body = err.code, err.read().decode()
    return status, " ".join(html.unescape(re.sub(r"<[^>]+>", " ", body)).split())


def test_culler_warns_culls_idle_gpus_and_spares_busy_exempt_and_unmeasured(make_hub, tmp_path: Path) -> None:
    hub: Hub = make_hub(CONFIG, env={"GPUPOOL_CULLER": "0"}).start()  # this test drives the passes
    for user in ("idle1", "busy1", "nodata1", "admin"):
        hub.spawn(user, "0.25")
    samples = tmp_path / "samples.json"
    samples.write_text(
        json.dumps(
            {
                "idle1/": {"util_pct": 0},
                "busy1/": {"util_pct": 85, "memory_mib": 900},
                "admin/": {"util_pct": 0},
            }
        )
    )  # nodata1: NVML has nothing on it
    cfg = IdleCuller(
        sampler="file",
        idle_limit_s=1800,
        jupyter_idle_s=600,
        warn_before_s=600,
        max_age_s=2400,
        extension_s=600,
        window_s=30,
        stale_after_s=900,
    )
    t0 = time.time()
    now = [t0]
    culler = Culler(
        cfg,
        Client(TOKEN),
        f"{hub.url}/hub/api",
        f"http://127.0.0.1:{hub.api_port}/services/gpupool/",
        FileSampler(str(samples)),
        clock=lambda: now[0],
    )

    def at(minutes: int) -> dict:
        now[0] = t0 + minutes * 60
        # nodata1's owner is working in Jupyter (activity up to now, in travelled time)
        hub.api("POST", "/hub/api/users/nodata1/activity", {"servers": {"": {"last_activity": iso(now[0])}}})
        return culler.run_pass()

    def running() -> set[str]:
        return {s["owner"] for s in hub.allocations()}

    def page(user: str, path: str) -> tuple[int, str]:
        return page_of(hub, user, path)

    for m in range(0, 20, 5):
        assert at(m)["events"] == []
    warned = at(20)["events"]
    assert [(e["kind"], e["owner"], e["reason"]) for e in warned] == [("warn", "idle1", "idle-gpu")]
    # the owner sees the warning through the API the notebook widget reads
    status = hub.api("GET", "/services/gpupool/api/culler/status", token=hub.user_token("idle1"))
    assert [w["action"] for w in status["workspaces"]] == ["warn"]
    assert "will stop in 10 min because its GPU has been idle" in status["workspaces"][0]["message"]
    assert at(25)["events"] == []  # warned once, not every pass

    events = at(30)["events"]
    assert [(e["owner"], e["reason"]) for e in events if e["kind"] == "cull"] == [("idle1", "idle-gpu")]
    # the 40-minute session limit is now 10 minutes away for the others (not the exempt admin)
    assert {(e["owner"], e["reason"]) for e in events if e["kind"] == "warn"} == {
        ("busy1", "max-age"),
        ("nodata1", "max-age"),
    }
    until(lambda: "idle1" not in running(), "idle1's server stopped", timeout=30, detail=running)
    assert running() == {"busy1", "nodata1", "admin"}  # busy GPU, no GPU data, exempt admin

    until(lambda: not hub.api("GET", "/hub/api/users/idle1")["servers"], "idle1 stopped in the hub")
    # idle1's tab, reloaded: the hub's page says why the server stopped and what to do
    status, text = page("idle1", "/user/idle1/lab")
    assert status == 424, text
    # (the hub records the cull as the culler reports it: in the hub's time, not the travelled one)
    assert re.search(
        r"Server stopped Your server was stopped at \d\d:\d\d after 30 min idle: its GPU had been idle"
        r" while nobody used it\.",
        text,
    ), text
    assert "Start it again when you need it." in text and "Launch Server" in text, text

    # busy1 asks for more time, once
    token = hub.user_token("busy1")
    hub.api("POST", "/services/gpupool/api/culler/extend", {"server": ""}, token=token)
    # the status bar (the server's own endpoint, as JupyterLab reads it) has the new end at once:
    # the 40-minute limit and the 10-minute extension from the start, not "ends with the next pass"
    started = parse_iso(hub.api("GET", "/hub/api/users/busy1")["servers"][""]["started"])
    bar = hub.api("GET", "/user/busy1/gpupool/status", token=token)
    assert bar["cull_at"] == pytest.approx(started + 2400 + 600, abs=0.01), bar
    assert not bar["extendable"] and bar["action"] == "keep"
    status, message = hub.api_error(
        "POST", "/services/gpupool/api/culler/extend", {"server": ""}, token=token
    )
    assert status == 409 and "already extended once" in message

    report = at(40)  # the 40-minute session limit
    events = report["events"]
    assert {(e["owner"], e["reason"]) for e in events if e["kind"] == "cull"} == {("nodata1", "max-age")}
    # the culler's next pass says the same end the status bar showed
    assert next(w for w in report["workspaces"] if w["owner"] == "busy1")["cull_at"] == bar["cull_at"]
    until(lambda: "nodata1" not in running(), "nodata1's server stopped", timeout=30, detail=running)
    until(lambda: not hub.api("GET", "/hub/api/users/nodata1")["servers"], "nodata1 stopped in the hub")
    # the spawn-pending page (where the hub sends a stopped server's tab too), in a browser's session
    web = WebUser(hub.url, "nodata1")
    web.log_in(PASSWORD)
    status, _, body = web.get("/hub/spawn-pending/nodata1")
    text = " ".join(html.unescape(re.sub(r"<[^>]+>", " ", body)).split())
    assert re.search(r"was stopped at \d\d:\d\d: it reached the longest session allowed\.", text), text
    assert running() == {"busy1", "admin"}
    kinds = [e["kind"] for e in hub.api("GET", "/services/gpupool/api/events?kind=cull")["events"]]
    assert kinds == ["cull", "cull"]


def test_only_the_culler_service_may_report_or_list(hub: Hub) -> None:
    token = hub.user_token("eve")
    status, _ = hub.api_error("POST", "/services/gpupool/api/culler/report", {"workspaces": []}, token=token)
    assert status == 403
    status, _ = hub.api_error("GET", "/services/gpupool/api/culler/targets", token=token)
    assert status == 403
    status, message = hub.api_error(
        "POST", "/services/gpupool/api/culler/extend", {"server": "x"}, token=token
    )
    assert status == 404 and "no running GPU workspace 'x' of eve" in message


def kernel_pid(kernel_id: str) -> int | None:
    """The process of a kernel: its command line names its connection file."""
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                if f"kernel-{kernel_id}.json".encode() in (proc / "cmdline").read_bytes():
                    return int(proc.name)
            except OSError:
                continue
    return None


def test_a_workspace_over_its_gpu_memory_gets_its_kernels_restarted(make_hub, tmp_path: Path) -> None:
    hub: Hub = make_hub(CONFIG, env={"GPUPOOL_CULLER": "0"}).start()
    hub.spawn("mem1", "0.25")
    token = hub.user_token("mem1")
    kernel = hub.api("POST", "/user/mem1/api/kernels", {"name": "python3"}, token=token)
    before = until(lambda: kernel_pid(kernel["id"]), "the kernel's process", timeout=60)
    samples = tmp_path / "samples.json"  # far more GPU memory than a quarter GPU has
    samples.write_text(json.dumps({"mem1/": {"util_pct": 90, "memory_mib": 10**6}}))
    cfg = IdleCuller(sampler="file", memory_resolver="restart-kernel", memory_grace_s=300, window_s=30)
    t0 = time.time()
    now = [t0]
    culler = Culler(
        cfg,
        Client(TOKEN),
        f"{hub.url}/hub/api",
        f"http://127.0.0.1:{hub.api_port}/services/gpupool/",
        FileSampler(str(samples)),
        clock=lambda: now[0],
    )
    events = culler.run_pass()["events"]
    assert [(e["kind"], e["reason"]) for e in events] == [("memory", "memory")]  # warned first
    assert kernel_pid(kernel["id"]) == before
    now[0] = t0 + 301
    events = culler.run_pass()["events"]
    assert [(e["kind"], e["reason"]) for e in events] == [("memory", "restart-kernel")]
    assert "restarted its kernels because it uses 1000000 MiB of GPU memory" in events[0]["message"]
    until(
        lambda: kernel_pid(kernel["id"]) not in (None, before),
        "the kernel restarted (a new process)",
        timeout=60,
    )
    # the server and the kernel (same id, new process) are still there; nothing was stopped
    assert [k["id"] for k in hub.api("GET", "/user/mem1/api/kernels", token=token)] == [kernel["id"]]
    assert {s["owner"] for s in hub.allocations()} == {"mem1"}
    # the timer starts again: no second restart on the next pass
    now[0] = t0 + 330
    assert [e["reason"] for e in culler.run_pass()["events"]] == ["memory"]


def test_an_unknown_memory_resolver_is_a_config_error() -> None:
    from traitlets import TraitError

    with pytest.raises(TraitError, match="memory_resolver"):
        IdleCuller(memory_resolver="reboot")


def test_warnings_for_the_home_page_are_the_users_own_and_extendable_only_once() -> None:
    from types import SimpleNamespace

    from traitlets.config import Config

    from gpupool.api.auth import Directory
    from gpupool.api.services import ApiServices
    from gpupool.api.warnings import warnings_for
    from gpupool.hub.adapter import HubApp
    from gpupool.wiring.root import GPUPoolHub, Running

    root = GPUPoolHub(Config())
    assert warnings_for(root, SimpleNamespace(name="ann")) == []  # before the gpupool API runs
    services = ApiServices(SimpleNamespace(), Directory())  # where the culler's last pass is kept
    services.culler = {
        "pass_time": 0,
        "workspaces": {
            "ann/": {
                "owner": "ann",
                "name": "",
                "action": "warn",
                "reason": "idle-gpu",
                "message": "will stop",
            },
            "ann/big": {
                "owner": "ann",
                "name": "big",
                "action": "warn",
                "reason": "memory",
                "message": "uses",
            },
            "ann/old": {
                "owner": "ann",
                "name": "old",
                "action": "warn",
                "reason": "max-age",
                "extended": True,
                "message": "will stop",
            },
            "ann/ok": {"owner": "ann", "name": "ok", "action": "keep"},
            "bob/": {
                "owner": "bob",
                "name": "",
                "action": "warn",
                "reason": "idle-gpu",
                "message": "bob's",
            },
        },
    }
    root.serving(Running(HubApp(SimpleNamespace()), services))  # the hub has started (no user read)
    got = warnings_for(root, SimpleNamespace(name="ann"), "/jhub")
    assert [(w["name"], w["extend_url"]) for w in got] == [
        ("", "/jhub/services/gpupool/culler/extend?server="),
        ("big", ""),
        ("old", ""),
    ]
    assert warnings_for(root, None) == [] and warnings_for(root, SimpleNamespace(name="cy")) == []


@pytest.mark.browser
def test_the_hub_home_page_shows_the_warning_and_extends_once(make_hub, tmp_path: Path) -> None:
    from tests.browser import browser_page, login, shot
    from tests.hubtools import PASSWORD

    hub: Hub = make_hub(CONFIG, env={"GPUPOOL_CULLER": "0"}).start()
    hub.spawn("wendy", "0.25")
    hub.spawn("xavi", "0.25")
    samples = tmp_path / "samples.json"
    samples.write_text(json.dumps({"wendy/": {"util_pct": 0}, "xavi/": {"util_pct": 90}}))
    cfg = IdleCuller(sampler="file", idle_limit_s=1800, jupyter_idle_s=600, warn_before_s=600, window_s=30)
    now = [time.time()]
    culler = Culler(
        cfg,
        Client(TOKEN),
        f"{hub.url}/hub/api",
        f"http://127.0.0.1:{hub.api_port}/services/gpupool/",
        FileSampler(str(samples)),
        clock=lambda: now[0],
    )
    assert culler.run_pass()["events"] == []
    now[0] += 22 * 60  # nobody touched wendy's GPU or notebook since
    assert [e["owner"] for e in culler.run_pass()["events"]] == ["wendy"]
    with browser_page("home-warning") as page:
        login(page, hub.url, "xavi", PASSWORD)
        page.goto(f"{hub.url}/hub/home")
        page.wait_for_selector("#start, #stop")
        assert page.locator(".gpupool-warning").count() == 0  # wendy's warning is hers alone
    with browser_page("home-warning") as page:
        login(page, hub.url, "wendy", PASSWORD)
        page.goto(f"{hub.url}/hub/home")
        banner = page.locator(".gpupool-warning")
        assert "will stop in 8 min because its GPU has been idle" in banner.inner_text()
        assert page.locator("#stop").count() == 1  # the stock page is still there
        share = page.inner_text(".gpupool-default-share")  # under the hub's own Stop/My Server buttons
        assert (
            "0.25 GPU" in share and "stops at" in share and " min)" in share
        )  # (the culler's clock is travelled)
        shot(page, "home-1-warning")
        page.click(".gpupool-extend")
        page.wait_for_selector("#gpupool-extend")  # the gpupool service's confirmation
        page.click("#gpupool-extend")
        page.wait_for_url("**/hub/home")
        assert page.locator(".gpupool-warning").count() == 0
        shot(page, "home-2-extended")
        # once only
        page.goto(f"{hub.url}/services/gpupool/culler/extend")
        page.click("#gpupool-extend")
        assert "already extended once" in page.inner_text(".gpupool-error")
        # stopped from the home page: the share line goes with it, without a reload
        page.goto(f"{hub.url}/hub/home")
        page.locator(".gpupool-default-share").wait_for()
        page.click("#stop")
        page.locator(".gpupool-default-share").wait_for(state="detached", timeout=60_000)
        assert [s["owner"] for s in hub.allocations()] == ["xavi"]
    assert [e["kind"] for e in hub.api("GET", "/services/gpupool/api/events?kind=extend")["events"]] == [
        "extend"
    ]


def test_the_culler_may_enter_servers_only_when_a_rule_restarts_kernels() -> None:
    assert "access:servers" not in service_definition("c", "")[1]["scopes"]
    assert "access:servers" not in service_definition("c", "", {"memory_resolver": "stop"})[1]["scopes"]
    over = {"profile_overrides": {"gpu-big": {"memory_resolver": "restart-kernel"}}}
    assert "access:servers" in service_definition("c", "", over)[1]["scopes"]
    with pytest.raises(TraitError, match="memory_resolver 'reboot' is not one of"):
        IdleCuller(group_overrides={"lab": {"memory_resolver": "reboot"}})


def run_cell(hub: Hub, user: str, kernel_id: str, code: str, token: str) -> str:
    """Run a cell in a kernel of a real server, as JupyterLab does (the kernel's websocket); its
    printed output."""
    import asyncio
    import uuid

    from tornado.httpclient import HTTPRequest
    from tornado.websocket import websocket_connect

    async def go() -> str:
        url = hub.url.replace("http", "ws", 1) + f"/user/{user}/api/kernels/{kernel_id}/channels"
        ws = await websocket_connect(HTTPRequest(url, headers={"Authorization": f"token {token}"}))
        msg_id = uuid.uuid4().hex
        header = {"msg_id": msg_id, "username": user, "session": uuid.uuid4().hex}
        header |= {
            "msg_type": "execute_request",
            "version": "5.3",
            "date": dt.datetime.now(dt.UTC).isoformat(),
        }
        content = {"code": code, "silent": False, "store_history": True, "user_expressions": {}}
        content |= {"allow_stdin": False, "stop_on_error": True}
        await ws.write_message(
            json.dumps(
                {
                    "header": header,
                    "parent_header": {},
                    "metadata": {},
                    "content": content,
                    "channel": "shell",
                }
            )
        )
        out = []
        while True:
            msg = json.loads(await asyncio.wait_for(ws.read_message(), 120))
            if msg.get("parent_header", {}).get("msg_id") != msg_id:
                continue
            if msg["msg_type"] == "stream":
                out.append(msg["content"]["text"])
            elif msg["msg_type"] == "error":
                out.append(f"ERROR {msg['content']['evalue']}")
            elif msg["msg_type"] == "execute_reply":
                ws.close()
                return "".join(out)

    return asyncio.run(go())


def test_the_culler_hibernates_a_real_kernel_and_its_variable_comes_back_at_the_next_start(
    make_hub, tmp_path: Path
) -> None:
    # hibernation on for one group only (off by default): hib1 is in it
    on_for_group = (
        'c.JupyterHub.load_groups = {"keepers": {"users": ["hib1"]}}\n'
        'c.IdleCuller.group_overrides = {"keepers": {"hibernate": True}}\n'
    )
    hub: Hub = make_hub(CONFIG + on_for_group, env={"GPUPOOL_CULLER": "0"}).start()
    hub.spawn("hib1", "0.25")
    token = hub.user_token("hib1")
    # JupyterLab's status says so: "Hibernate now" is offered (off for others: test_browser_lab)
    assert hub.api("GET", "/user/hib1/gpupool/status", token=token)["hibernate"] is True
    web = WebUser(hub.url, "hib1")
    web.log_in(PASSWORD)
    assert "/user/hib1/gpupool/hibernate-now" in web.get("/hub/home")[2]  # and the home page's link
    notebook = {"path": "work.ipynb", "type": "notebook", "name": "work.ipynb", "kernel": {"name": "python3"}}
    kernel = hub.api("POST", "/user/hib1/api/sessions", notebook, token=token)["kernel"]["id"]
    assert (
        run_cell(hub, "hib1", kernel, "import numpy as np\nx = np.arange(1000.0)\nprint(x.sum())", token)
        == "499500.0\n"
    )
    samples = tmp_path / "samples.json"
    samples.write_text(json.dumps({"hib1/": {"util_pct": 0}}))
    now = [time.time()]
    culler = Culler(
        IdleCuller(sampler="file", hibernate=True, window_s=30, stale_after_s=10**6),
        Client(TOKEN),
        f"{hub.url}/hub/api",
        f"http://127.0.0.1:{hub.api_port}/services/gpupool/",
        FileSampler(str(samples)),
        clock=lambda: now[0],
    )
    culler.run_pass()
    now[0] += 3 * 3600  # GPU idle, Jupyter quiet
    events = culler.run_pass()["events"]
    assert [e["kind"] for e in events] == ["cull"], events
    assert "hibernated (1 kernel" in events[0]["message"]
    until(lambda: not hub.allocations(), "the share freed", timeout=60)
    # the size the server's save reported, kept by the hub: the admins' list, the user's status
    [row] = hub.api("GET", "/services/gpupool/api/admin/hibernated")["hibernated"]
    assert (row["owner"], row["name"], row["by"], row["kernels"]) == ("hib1", "", "culler", 1), row
    assert row["bytes"] > 8000 and row["notebooks"][0].endswith("work.ipynb"), row
    assert hub.api_error("GET", "/services/gpupool/api/admin/hibernated", token=token)[0] == 403
    [mine] = hub.api("GET", "/services/gpupool/api/hibernated", token=token)["hibernated"]
    assert (
        "the idle culler hibernated it" in mine["message"] and "come back when you start" in mine["message"]
    )
    # the open tab, reloaded: the hub's page says it was hibernated, and that starting wakes it
    until(lambda: not hub.api("GET", "/hub/api/users/hib1")["servers"], "hib1 stopped in the hub")
    status, text = page_of(hub, "hib1", "/user/hib1/lab")
    assert status == 424 and "Server hibernated Your server was hibernated at " in text, text
    assert "your variables come back when you start. Start it to wake it." in text, text
    hub.spawn("hib1", "0.25")  # the next start: the notebook opened again
    kernel = hub.api("POST", "/user/hib1/api/sessions", notebook, token=token)["kernel"]["id"]
    first = run_cell(hub, "hib1", kernel, "print(x.sum())", token)
    assert "gpupool: restored 2 variables" in first and first.endswith("499500.0\n"), first
    # the user hibernates it now: recorded in the hub with its size, as the culler's is
    try:
        said = run_cell(hub, "hib1", kernel, "%load_ext gpupool\n%gpupool hibernate", token)
    except (TypeError, OSError) as err:  # the server stops under the cell: its reply may not come
        said = f"(no reply: {err})"
    until(lambda: not hub.allocations(), "the share freed by %gpupool hibernate", timeout=60)
    [row] = hub.api("GET", "/services/gpupool/api/admin/hibernated")["hibernated"]
    assert row["by"] == "user" and row["bytes"] > 8000, (row, said)
    kinds = [e["kind"] for e in hub.api("GET", "/services/gpupool/api/events?kind=hibernate")["events"]]
    assert kinds == ["hibernate"], kinds
    # the home page's "Hibernate now": the server's own page saves (the notebook not woken yet
    # keeps its state), records it and stops the server
    hub.spawn("hib1", "0.25")
    hub.api("POST", "/user/hib1/api/sessions", notebook, token=token)
    page = f"{hub.url}/user/hib1/gpupool/hibernate-now"
    auth = {"Authorization": f"token {token}"}
    with urllib.request.urlopen(urllib.request.Request(page, headers=auth), timeout=30) as r:
        assert "Hibernate now</button>" in r.read().decode()
    done = urllib.request.Request(page, data=b"", method="POST", headers=auth)
    with urllib.request.urlopen(done, timeout=120) as r:
        text = r.read().decode()
    assert "Hibernated 1 kernel" in text and "this server stops now." in text, text
    until(lambda: not hub.allocations(), "the share freed by Hibernate now", timeout=60)
    kinds = [e["kind"] for e in hub.api("GET", "/services/gpupool/api/events?kind=hibernate")["events"]]
    assert kinds == ["hibernate", "hibernate"], kinds
