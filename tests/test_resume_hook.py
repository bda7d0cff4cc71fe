"""Resume on use in the kernel: the pre-run hook asks for the GPU back, waits with progress,
gives up after the hub's limit with who holds the GPUs; installed by the workspace start-up."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from gpupool.gpu.env import STARTUP_DIR

sys.path.insert(0, STARTUP_DIR)
from gpupool_resume import ResumeHook  # noqa: E402 - the module lives in the start-up folder


class Hub:
    """Answers the hook like the gpupool API would, from a script of states; time travels."""

    def __init__(self, states: list[dict]) -> None:
        self.states, self.calls, self.now, self.said = states, [], 0.0, []

    def call(self, method: str, path: str, body=None):
        self.calls.append((method, path))
        return self.states.pop(0) if len(self.states) > 1 else self.states[0]

    def sleep(self, s: float) -> None:
        self.now += s

    def hook(self) -> ResumeHook:
        return ResumeHook(
            self.call, "exp", say=self.said.append, sleep=self.sleep, clock=lambda: self.now, watch_s=3600
        )


def test_the_cell_runs_with_the_gpu_the_kernel_came_back_on():
    """After the wait, before the cell: the kernel's environment follows the hub's current GPU
    (a kernel that had not touched CUDA yet initialises it there; what the cell starts too)."""
    hub = Hub([{"state": "parked"}, {"state": "waiting"}, {"state": "running"}])
    states_when_followed = []
    hook = ResumeHook(
        hub.call,
        "exp",
        say=hub.said.append,
        sleep=hub.sleep,
        clock=lambda: hub.now,
        watch_s=3600,
        follow=lambda: states_when_followed.append(hub.states[0]["state"]),
    )
    assert hook() == "running"
    assert states_when_followed == ["running"]


def test_a_running_workspace_costs_one_status_call_per_burst_of_cells():
    hub = Hub([{"state": "running"}])
    hook = hub.hook()
    assert hook() == "running"
    assert hub.calls == [("GET", "api/parking/status?server=exp")] and hub.said == []
    hub.now += 5
    assert hook() == "running" and len(hub.calls) == 1  # "Run All": one check
    hub.now += 6
    hook()
    assert len(hub.calls) == 2


def test_a_parked_kernel_asks_waits_with_progress_and_runs_the_cell_when_restored():
    waiting = {
        "state": "waiting",
        "message": "waiting for a A100 GPU (1 GPU) for 3 s; held by: another user's workspace (1 GPU)",
        "wait_limit_s": 300,
    }
    hub = Hub(
        [
            {"state": "parked", "wait_limit_s": 300},
            waiting,
            waiting,
            {"state": "resuming"},
            {"state": "running"},
        ]
    )
    assert hub.hook()() == "running"
    assert hub.calls[1] == ("POST", "api/parking/resume")
    assert any("held by: another user's workspace" in s for s in hub.said)
    assert hub.said[-1] == "gpupool: GPU back after 3.0 s"


def test_no_capacity_within_the_limit_tells_who_holds_the_gpus_and_lets_the_cell_run():
    waiting = {"state": "waiting", "message": "held by: ben's workspace (1 GPU)", "wait_limit_s": 30}
    hub = Hub([{"state": "parked", "wait_limit_s": 30}, waiting])
    assert hub.hook()() == "waiting"
    assert hub.now == 30
    assert "no GPU after 30 s" in hub.said[-1] and "ben's workspace" in hub.said[-1]
    assert "CPU code works" in hub.said[-1]


def test_a_hub_that_does_not_answer_never_breaks_or_slows_cells():
    hub = Hub([None])
    hook = hub.hook()
    assert hook() == "unknown" and len(hub.calls) == 1
    hook()  # the next cells do not wait for a hub that is away ...
    assert len(hub.calls) == 1
    hub.now += 31
    hook()  # ... for long
    assert len(hub.calls) == 2


def test_a_gpu_parked_while_a_cell_runs_is_claimed_back_at_once():
    """A long CPU phase can get a cell's GPU parked; the driver then holds its next CUDA call,
    and no next cell can start to claim the GPU: the watcher claims it."""
    state, calls, said = {"now": "running"}, [], []
    claimed = threading.Event()

    def call(method, path, body=None):
        calls.append(method)
        if method == "POST":
            state["now"] = "resuming"
            claimed.set()
        return {"state": state["now"]}

    hook = ResumeHook(call, "", say=said.append, watch_s=0.01)
    assert hook() == "running"  # the cell starts on its GPU
    state["now"] = "parked"  # the culler parks it mid-cell
    assert claimed.wait(10)
    hook.after_cell()
    assert said == ["gpupool: the GPU was parked while this cell ran; asking for it back"]
    before = len(calls)
    time.sleep(0.05)
    assert len(calls) == before  # the cell ended: no more checks


def test_a_hostile_wait_limit_is_bounded():
    hub = Hub([{"state": "parked", "wait_limit_s": "1e99"}, {"state": "waiting", "message": ""}])
    hub.hook()()
    assert hub.now == 24 * 3600


def test_the_workspace_start_up_hooks_every_ipython_shell(tmp_path):
    """A real IPython shell in a process with the workspace's PYTHONPATH asks a real HTTP
    server before its cell runs."""
    seen: list[str] = []

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 - http.server's name
            seen.append(self.path)
            body = json.dumps({"state": "running"}).encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        env = dict(
            os.environ,
            PYTHONPATH=STARTUP_DIR,
            GPUPOOL_API_URL=f"http://127.0.0.1:{server.server_port}/x/",
            JUPYTERHUB_API_TOKEN="t",
            JUPYTERHUB_SERVER_NAME="exp",
            IPYTHONDIR=str(tmp_path),
        )
        code = (
            "from IPython.core.interactiveshell import InteractiveShell\n"
            "InteractiveShell.instance().run_cell('x = 1')\n"
        )
        out = subprocess.run(
            [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60
        )
        assert out.returncode == 0, out.stderr
    finally:
        server.shutdown()
    assert seen == ["/x/api/parking/status?server=exp"]
