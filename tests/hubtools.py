"""Start a real JupyterHub (+ configurable-http-proxy) on 127.0.0.1 for tests.

The hub runs gpupool's embedded config in a subprocess, exactly as `gpupool up` does,
with free ports and a temporary state folder. Tests talk to it over HTTP like any
client: the REST API with an admin service token, or a browser.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
EMBEDDED_CONFIG = REPO / "hub_ext" / "embedded_config.py"
ADMIN_TOKEN = "test-admin-token-0123456789abcdef"
PASSWORD = "test-password"
ADMIN_PASSWORD = "test-admin-password-0123456789abcdef"  # JupyterHub wants 32 characters for admins


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Hub:
    """A running hub; `url` is the public (proxy) address."""

    state: Path
    extra_config: str = ""
    env: dict[str, str] = field(default_factory=dict)
    port: int = field(default_factory=free_port)
    hub_port: int = field(default_factory=free_port)
    api_port: int = field(default_factory=free_port)
    proxy_api_port: int = field(default_factory=free_port)
    proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def log_path(self) -> Path:
        return self.state / "hub.log"

    def write_config(self) -> Path:
        path = self.state / "test_config.py"
        path.write_text(textwrap.dedent(f"""
            c.JupyterHub.services = [{{"name": "test-admin", "api_token": "{ADMIN_TOKEN}"}}]
            c.JupyterHub.load_roles = [{{"name": "admin", "services": ["test-admin"]}}]
            c.JupyterHub.last_activity_interval = 5
            c.Spawner.poll_interval = 1
            c.Spawner.start_timeout = 120
            c.Spawner.http_timeout = 120
        """) + textwrap.dedent(self.extra_config))
        return path

    def start(self, timeout: float = 60) -> Hub:
        try:
            return self._start(timeout)
        except BaseException:
            self.stop()  # a hub that failed to come up must not leave its proxy behind
            raise

    def _start(self, timeout: float) -> Hub:
        self.state.mkdir(parents=True, exist_ok=True)
        env = dict(
            os.environ,
            GPUPOOL_STATE_DIR=str(self.state),
            GPUPOOL_CONFIG=str(self.write_config()),
            GPUPOOL_PORT=str(self.port),
            GPUPOOL_HUB_PORT=str(self.hub_port),
            GPUPOOL_API_PORT=str(self.api_port),
            GPUPOOL_PROXY_API_PORT=str(self.proxy_api_port),
            GPUPOOL_DEMO_PASSWORD=PASSWORD,
            GPUPOOL_DEMO_ADMIN_PASSWORD=ADMIN_PASSWORD,
            PATH=f"{REPO / 'node_modules' / '.bin'}{os.pathsep}{Path(sys.executable).parent}"
                 f"{os.pathsep}{os.environ.get('PATH', '')}",
        )
        # test hubs share one account unless a test asks for accounts per user (tests/test_system_accounts.py)
        env.setdefault("GPUPOOL_SPAWNER", "gpupool-simple")
        env.update(self.env)
        log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "jupyterhub", "-f", str(EMBEDDED_CONFIG)],
            cwd=self.state, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"hub exited with {self.proc.returncode}:\n{self.tail()}")
            try:
                self.api("GET", "/hub/api/")
                self.api("GET", "/services/gpupool/api/pool")
                return self
            except (OSError, urllib.error.URLError):
                time.sleep(0.3)
        raise RuntimeError(f"hub did not answer in {timeout}s:\n{self.tail()}")

    def tail(self, lines: int = 60) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def wait_job(self, job_id: str, states: set[str], token: str, timeout: float = 120) -> dict:
        """Poll a train job through the gpupool API until it reaches one of `states`."""
        deadline = time.monotonic() + timeout
        job: dict = {}
        while time.monotonic() < deadline:
            job = self.api("GET", f"/services/gpupool/api/jobs/{job_id}", token=token)
            if job["state"] in states:
                return job
            time.sleep(0.2)
        raise AssertionError(f"job {job_id} never reached {states} (now {job.get('state')}):\n{self.tail()}")

    def kill9(self) -> None:
        """Crash the hub process only (servers and the proxy survive, as in a real crash)."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()

    def stop(self) -> None:
        """Stop the hub, its proxy and every server it started (the test's whole process group)."""
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        self.kill_leftovers()
        self.proc = None

    def kill_leftovers(self) -> None:
        """Servers and proxy run in their own sessions; find them by the state folder."""
        self.kill_cgroups()
        out = subprocess.run(["ps", "-ww", "-eo", "pid,args"], capture_output=True, text=True).stdout
        # -ww: ps cuts lines at $COLUMNS when it is set (pytest sets it), hiding the state folder
        for line in out.splitlines()[1:]:
            pid, _, args = line.strip().partition(" ")
            # the culler service names the hub's gpupool API port on its command line
            if str(self.state) in args or f"127.0.0.1:{self.proxy_api_port}" in args or (
                f"127.0.0.1:{self.api_port}/" in args and "gpupool.idle_culler" in args) or (
                "configurable-http-proxy" in args and f"--port {self.port}" in args
            ):
                try:
                    os.kill(int(pid), signal.SIGKILL)
                except (ProcessLookupError, ValueError):
                    pass
        # servers run in HOME under the state folder; check their environment too
        for proc in Path("/proc").iterdir():
            if not proc.name.isdigit():
                continue
            try:
                environ = (proc / "environ").read_bytes()
            except OSError:
                continue
            if f"GPUPOOL_STATE_DIR={self.state}".encode() in environ or (
                f"HOME={self.state}/home/".encode() in environ
            ):
                try:
                    os.kill(int(proc.name), signal.SIGKILL)
                except ProcessLookupError:
                    pass

    def kill_cgroups(self) -> None:
        """Whatever this hub's jobs and workspaces started — in whatever session — ends with their
        cgroups (gpupool.contain; nothing to do where the hub had none)."""
        try:
            from gpupool.contain import detect, hub_key
        except ImportError:
            return
        tree = detect("auto", hub_key(f"sqlite:///{self.state}/gpupool.sqlite"))
        if not tree.available:
            return
        for inst in tree.names():
            for workload in tree.names(inst):
                tree.end(f"{inst}/{workload}", 10)
            tree.remove(inst)
        try:
            tree.root.rmdir()
        except OSError:
            pass

    # --- HTTP ----------------------------------------------------------------
    def api(self, method: str, path: str, body: Any = None, token: str = ADMIN_TOKEN,
            timeout: float = 30) -> Any:
        """Call the hub or gpupool API; returns parsed JSON, raises HTTPError on 4xx/5xx."""
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.url + path, data=data, method=method,
                                     headers={"Authorization": f"token {token}"})
        with urllib.request.urlopen(req, timeout=timeout) as r:
            text = r.read().decode()
        return json.loads(text) if text else None

    def api_error(self, method: str, path: str, body: Any = None, token: str = ADMIN_TOKEN) -> tuple[int, str]:
        """(status, message) of a call that must fail."""
        try:
            self.api(method, path, body, token=token)
        except urllib.error.HTTPError as err:
            payload = err.read().decode()
            try:
                return err.code, json.loads(payload).get("message", payload)
            except ValueError:
                return err.code, payload
        raise AssertionError(f"{method} {path} succeeded but should have failed")

    def user_token(self, name: str) -> str:
        self.api("POST", f"/hub/api/users/{name}") if not self.user_exists(name) else None
        return self.api("POST", f"/hub/api/users/{name}/tokens", {"note": "test"})["token"]

    def user_exists(self, name: str) -> bool:
        try:
            self.api("GET", f"/hub/api/users/{name}")
            return True
        except urllib.error.HTTPError:
            return False

    def spawn(self, name: str, gpus: Any, server: str = "", wait: bool = True, timeout: float = 120) -> None:
        if not self.user_exists(name):
            self.api("POST", f"/hub/api/users/{name}")
        path = f"/hub/api/users/{name}/servers/{server}" if server else f"/hub/api/users/{name}/server"
        self.api("POST", path, {"gpus": gpus})
        if wait:
            self.wait_ready(name, server, timeout)

    def wait_ready(self, name: str, server: str = "", timeout: float = 120) -> dict:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            model = self.api("GET", f"/hub/api/users/{name}")
            s = model.get("servers", {}).get(server)
            if s and s.get("ready"):
                return s
            if not s:
                raise AssertionError(f"{name}/{server} is gone:\n{self.tail()}")
            time.sleep(0.3)
        raise AssertionError(f"{name}/{server} not ready after {timeout}s:\n{self.tail()}")

    def stop_server(self, name: str, server: str = "", timeout: float = 60) -> None:
        path = f"/hub/api/users/{name}/servers/{server}" if server else f"/hub/api/users/{name}/server"
        self.api("DELETE", path)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            s = self.api("GET", f"/hub/api/users/{name}").get("servers", {}).get(server)
            if not s:
                return
            time.sleep(0.3)
        raise AssertionError(f"{name}/{server} did not stop")

    def allocations(self) -> list[dict]:
        """Every share, from the gpupool API as an admin sees it."""
        shares = []
        for gpu in self.api("GET", "/services/gpupool/api/pool")["gpus"]:
            for s in gpu["shares"]:
                shares.append({**s, "gpu": gpu["index"], "node": gpu["node"]})
        return shares
