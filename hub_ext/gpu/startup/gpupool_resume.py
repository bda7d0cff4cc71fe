"""Resume on use: before a cell runs, a parked workspace asks the hub for its GPU back.

Installed into every IPython shell of a gpupool workspace by sitecustomize.py (next to this
file). Standard library only: the kernel's environment need not have gpupool installed.
The hub restores the kernel's GPU memory (onto another GPU of the same model when its own
is taken, the UUID remapped by the driver) and unlocks it; this hook only asks and waits.
Then, before the cell, the kernel's environment follows the share's current GPU
(gpupool_gpuenv.py), so that what the cell starts (`!nvidia-smi`, a subprocess, a kernel
that had not touched CUDA yet) uses the GPU the workspace holds now.
"""

from __future__ import annotations

import json
import os
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from typing import Any

PARKED_STATES = ("parked", "waiting", "resuming", "failed")


def _follow_current_gpu() -> None:
    try:
        import gpupool_gpuenv
    except ImportError:  # an older start-up folder: the environment as started
        return
    gpupool_gpuenv.refresh()


class HubCalls:
    """GET/POST the gpupool API with the server's own token; None when the hub does not answer."""

    def __init__(self, api_url: str, token: str, timeout: float = 5.0) -> None:
        self.api_url, self.token, self.timeout = api_url.rstrip("/") + "/", token, timeout

    def __call__(self, method: str, path: str, body: Any = None) -> dict[str, Any] | None:
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(
            self.api_url + path,
            data=data,
            method=method,
            headers={"Authorization": f"token {self.token}", "Content-Type": "application/json"},
        )
        try:
            with urllib.request.urlopen(req, timeout=self.timeout) as r:
                reply = json.loads(r.read(1 << 20) or b"{}")
        except (OSError, ValueError):  # URLError/HTTPError are OSErrors
            return None
        return reply if isinstance(reply, dict) else None


class ResumeHook:
    """pre_run_cell: a parked GPU comes back before the cell. While a cell runs, a watcher
    thread checks every `watch_s`: a GPU parked mid-cell (a long CPU phase) is claimed back at
    once, so the cell's next CUDA call — which the driver holds while parked — goes on after
    the restore instead of waiting for a next cell that cannot start."""

    def __init__(
        self,
        call: Callable[..., dict[str, Any] | None],
        server: str,
        say: Callable[[str], None] = print,
        sleep: Callable[[float], None] = time.sleep,
        clock: Callable[[], float] = time.monotonic,
        poll_s: float = 1.0,
        watch_s: float = 10.0,
        recheck_s: float = 10.0,
        follow: Callable[[], None] = _follow_current_gpu,
    ) -> None:
        self.call, self.server, self.say, self.sleep, self.clock = call, server, say, sleep, clock
        self.follow = follow  # the environment's GPU variables from the hub's current ones
        self.poll_s, self.watch_s, self.recheck_s = poll_s, watch_s, recheck_s
        self.quiet_until = 0.0  # the hub did not answer: no per-cell check until then
        # cells in quick succession ("Run All") check once: a park in between is caught by
        # the watcher of the cell that meets it, within watch_s
        self.running_until = 0.0
        self._cell_done: threading.Event | None = None
        self.status_path = "api/parking/status?server=" + urllib.parse.quote(server)

    def __call__(self, info: Any = None) -> str:
        """IPython's pre_run_cell callback; returns the final state (for tests)."""
        state = self.before_cell()
        try:
            self.follow()  # after a resume: the GPU it came back on
        except Exception:  # noqa: BLE001 - never stop a cell over this
            pass
        self._watch()
        return state

    def after_cell(self, result: Any = None) -> None:
        """IPython's post_run_cell callback: the cell ended, its watcher stops."""
        if self._cell_done is not None:
            self._cell_done.set()
            self._cell_done = None

    def _watch(self) -> None:
        self.after_cell()
        done = self._cell_done = threading.Event()

        def watch() -> None:
            while not done.wait(self.watch_s):
                state = self.call("GET", self.status_path)
                if state and state.get("state") == "parked":
                    self.say("gpupool: the GPU was parked while this cell ran; asking for it back")
                    self.call("POST", "api/parking/resume", {"server": self.server})

        threading.Thread(target=watch, name="gpupool-resume-watch", daemon=True).start()

    def before_cell(self) -> str:
        if self.clock() < self.quiet_until:
            return "unknown"
        if self.clock() < self.running_until:
            return "running"
        state = self.call("GET", self.status_path)
        if not state:
            self.quiet_until = self.clock() + 30  # a hub restarting must not slow every cell
            return "unknown"
        if state.get("state") not in PARKED_STATES:
            if state.get("state") == "running":
                self.running_until = self.clock() + self.recheck_s
            return str(state.get("state"))  # the common case: one quick GET
        limit = _bounded(state.get("wait_limit_s"), 300.0)
        started = self.clock()
        self.say("gpupool: GPU parked — asking the hub for it back…")
        state = self.call("POST", "api/parking/resume", {"server": self.server}) or state
        last = ""
        while state.get("state") in ("parked", "waiting", "resuming") and self.clock() - started < limit:
            message = state.get("message", "")
            if message != last and state.get("state") == "waiting":
                self.say(f"gpupool: {message}")
                last = message
            self.sleep(self.poll_s)
            state = self.call("GET", self.status_path) or state
        waited = self.clock() - started
        if state.get("state") == "running":
            self.say(f"gpupool: GPU back after {waited:.1f} s")
        elif state.get("state") == "failed":
            self.say(
                f"gpupool: {state.get('message', 'the GPU could not be restored')}; ask an admin or"
                " restart the kernel"
            )
        else:
            self.say(
                f"gpupool: no GPU after {waited:.0f} s — {state.get('message', '')}. This cell runs now:"
                " CPU code works; a CUDA call waits until the GPU comes back (your request stays"
                " queued). Stop the kernel to give the request up."
            )
        return str(state.get("state"))


def _bounded(value: Any, default: float) -> float:
    try:
        number = float(value)
    except (TypeError, ValueError):
        return default
    return min(max(number, 0.0), 24 * 3600.0)


def install(shell: Any) -> None:
    """Register the hook on an IPython shell (called once per shell by sitecustomize)."""
    api = os.environ.get("GPUPOOL_API_URL", "")
    token = os.environ.get("JUPYTERHUB_API_TOKEN", "")
    if not api or not token or os.environ.get("GPUPOOL_RESUME_HOOK", "1") == "0":
        return
    hook = ResumeHook(HubCalls(api, token, timeout=2.0), os.environ.get("JUPYTERHUB_SERVER_NAME", ""))
    shell.events.register("pre_run_cell", hook)
    shell.events.register("post_run_cell", hook.after_cell)
