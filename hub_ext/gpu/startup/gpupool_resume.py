"""Resume on use: before a cell runs, a parked workspace asks the hub for its GPU back.

Installed into every IPython shell of a gpupool workspace by sitecustomize.py (next to this
file). Standard library only: the kernel's environment need not have gpupool installed.
The hub restores the kernel's GPU memory (onto another GPU of the same model when its own
is taken, the UUID remapped by the driver) and unlocks it; this hook only asks and waits.
"""

from __future__ import annotations

import json
import os
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from typing import Any

PARKED_STATES = ("parked", "waiting", "resuming", "failed")


class HubCalls:
    """GET/POST the gpupool API with the server's own token; None when the hub does not answer."""

    def __init__(self, api_url: str, token: str, timeout: float = 5.0) -> None:
        self.api_url, self.token, self.timeout = api_url.rstrip("/") + "/", token, timeout

    def __call__(self, method: str, path: str, body: Any = None) -> dict | None:
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.api_url + path, data=data, method=method,
                                     headers={"Authorization": f"token {self.token}",
                                              "Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=self.timeout) as r:
                reply = json.loads(r.read(1 << 20) or b"{}")
        except (OSError, ValueError):  # URLError/HTTPError are OSErrors
            return None
        return reply if isinstance(reply, dict) else None


class ResumeHook:
    def __init__(self, call: Callable[..., dict | None], server: str, say: Callable[[str], None] = print,
                 sleep: Callable[[float], None] = time.sleep, clock: Callable[[], float] = time.monotonic,
                 poll_s: float = 1.0) -> None:
        self.call, self.server, self.say, self.sleep, self.clock = call, server, say, sleep, clock
        self.poll_s = poll_s
        self.quiet_until = 0.0  # the hub did not answer: no per-cell check until then
        self.status_path = "api/parking/status?server=" + urllib.parse.quote(server)

    def __call__(self, info: Any = None) -> str:
        """IPython's pre_run_cell callback; returns the final state (for tests)."""
        if self.clock() < self.quiet_until:
            return "unknown"
        state = self.call("GET", self.status_path)
        if not state:
            self.quiet_until = self.clock() + 30  # a hub restarting must not slow every cell
            return "unknown"
        if state.get("state") not in PARKED_STATES:
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
            self.say(f"gpupool: {state.get('message', 'the GPU could not be restored')}; ask an admin or"
                     " restart the kernel")
        else:
            self.say(f"gpupool: no GPU after {waited:.0f} s — {state.get('message', '')}. This cell runs now:"
                     " CPU code works; a CUDA call waits until the GPU comes back (your request stays"
                     " queued). Stop the kernel to give the request up.")
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
