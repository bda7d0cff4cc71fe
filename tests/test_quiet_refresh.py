"""A widget that reads the API again by itself is not someone at work: before, every refresh of
`%gpupool`'s widget (every 30 s) and of a JobMonitor was kernel activity to the Jupyter server,
which told the hub, so the idle culler never found Jupyter quiet (each warning the widget showed
moved the stop again; culled only after the kernel was deleted). Nor is the JupyterLab status
item's reading of the share.

A real server and kernel: the code runs through the server's kernel websocket (straight to the
server, as the hub's own requests go, not through the proxy) and the server's own record of
activity (GET api/status, which itself is not counted) must not move while the widget sends
updates."""

from __future__ import annotations

import asyncio
import json
import time
import uuid

import pytest
from tornado.httpclient import HTTPRequest
from tornado.websocket import websocket_connect

from tests.hubtools import Hub

pytestmark = pytest.mark.hub
J = "/services/gpupool/api/jobs"
JOB = "import time\nfor i in range(400):\n    print('step', i, flush=True)\n    time.sleep(0.1)\n"


def message(code: str) -> dict:
    msg_id = uuid.uuid4().hex
    return {
        "channel": "shell",
        "header": {
            "msg_id": msg_id,
            "msg_type": "execute_request",
            "username": "t",
            "session": "t",
            "version": "5.3",
            "date": "",
        },
        "parent_header": {},
        "metadata": {},
        "content": {
            "code": code,
            "silent": False,
            "store_history": True,
            "user_expressions": {},
            "allow_stdin": False,
            "stop_on_error": True,
        },
        "buffers": [],
    }


async def run_then_listen(ws_url: str, token: str, code: str, listen_s: float, between) -> dict:
    """Execute `code`, wait until the kernel is idle again, then count the IOPub messages by type
    for `listen_s` seconds; `between(...)` is called once at the start and once at the end."""
    ws = await websocket_connect(HTTPRequest(ws_url, headers={"Authorization": f"token {token}"}))
    request = message(code)
    await ws.write_message(json.dumps(request))
    while True:
        msg = json.loads(await asyncio.wait_for(ws.read_message(), 120))
        if msg["msg_type"] == "error":
            raise AssertionError(msg["content"])
        if (
            msg["msg_type"] == "status"
            and msg["content"]["execution_state"] == "idle"
            and msg["parent_header"].get("msg_id") == request["header"]["msg_id"]
        ):
            break
    counts: dict[str, int] = {}
    await asyncio.sleep(1)  # the execute's own activity settles
    before = between()
    deadline = time.monotonic() + listen_s
    while (left := deadline - time.monotonic()) > 0:
        try:
            msg = json.loads(await asyncio.wait_for(ws.read_message(), left))
        except TimeoutError:
            break
        counts[msg["msg_type"]] = counts.get(msg["msg_type"], 0) + 1
    after = between()
    ws.close()
    return {"counts": counts, "before": before, "after": after}


def test_widget_refreshes_and_share_reads_are_not_user_activity(make_hub) -> None:
    hub: Hub = make_hub("c.TrainPool.tick_s = 0.3\n", env={"GPUPOOL_CULLER": "0"}).start()
    hub.spawn("quinn", "0.25")
    token = hub.user_token("quinn")
    [target] = hub.api("GET", "/services/gpupool/api/culler/targets")["workspaces"]
    server = target["server_url"].rstrip("/")  # the server itself, not through the proxy
    kernel = hub.api("POST", "/user/quinn/api/kernels", {"name": "python3"}, token=token)
    job = hub.api("POST", J, {"project": "default", "gpus": 0.25, "script": JOB}, token=token)
    hub.wait_job(job["id"], {"running"}, token)

    def activity() -> str:
        for path in ("/gpupool/status", "/gpupool/workspace"):  # what JupyterLab reads every few seconds
            _get(server + path, token)
        return _get(server + "/api/status", token)["last_activity"]

    code = (
        "from gpupool.widgets import JobMonitor, WorkspaceStatus\n"
        f"monitor = JobMonitor(job_id={job['id']!r}, interval=0.3)\n"
        "status = WorkspaceStatus(interval=0.3)\n"
    )
    ws_url = server.replace("http://", "ws://") + f"/api/kernels/{kernel['id']}/channels"
    seen = asyncio.run(run_then_listen(ws_url, token, code, 6, activity))
    # the widgets did send their new values (the job's log grows) ...
    assert seen["counts"].get("comm_msg", 0) >= 5, seen
    # ... and the server saw no one at work meanwhile
    assert seen["after"] == seen["before"], seen


def _get(url: str, token: str) -> dict:
    import urllib.request

    req = urllib.request.Request(url, headers={"Authorization": f"token {token}"})
    with urllib.request.urlopen(req, timeout=30) as r:
        return json.loads(r.read())
