"""Start a real JupyterHub (+ configurable-http-proxy) on 127.0.0.1 for tests.

The hub is the one `make up` starts on this machine: `gpupool up` itself runs it, in a
subprocess, with free ports and a state folder of its own. Run as root (as CI runs), that is a hub
that gives each hub user a Unix account and runs their servers and jobs as it, in the users'
Python environment it installs under /opt/gpupool/<install key>; elsewhere everyone shares the test's account, as
`make up` does there. Only a test about the shared mode asks for it (`Hub(accounts=False)`).

Accounts are real, and other checkouts may run the same tests on this machine at the same time:
each hub names its accounts with a prefix of its own (`c.SystemAccounts.prefix`, e.g. `t3f9a2c-`
where `make up` has `jupyter-`) and removes them when the test ends (`Hub.cleanup`). Its state
folder must be one those accounts can pass through to their homes: pytest's own temporary
folders are 0700 (and pytest makes them 0700 again at every session start), so a root hub keeps
its state in a folder of its own under the system's temporary folder instead.

Tests talk to the hub over HTTP like any client: the REST API with an admin service token, a
browser, or `WebUser` (the log-in and spawn forms, as a browser posts them).
"""

from __future__ import annotations

import atexit
import contextlib
import http.cookiejar
import json
import os
import pwd
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.support.wait import until

REPO = Path(__file__).resolve().parent.parent
ADMIN_TOKEN = "test-admin-token-0123456789abcdef"
PASSWORD = "test-password"
ADMIN_PASSWORD = "test-admin-password-0123456789abcdef"  # JupyterHub wants 32 characters for admins
ACCOUNTS_BANNER = "each user runs as a Unix account of their own"


def _terminal_signals() -> None:
    """SIGINT and SIGQUIT as a terminal gives them: a shell that started pytest in the background
    left them ignored, and the hub's services (the culler) would then outlive the hub's SIGINT and
    make every stop wait for JupyterHub's timeouts."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.signal(signal.SIGQUIT, signal.SIG_DFL)


def why_no_accounts() -> str:
    """ "" when a hub started here gives each user a Unix account (root, with useradd), else why not."""
    if os.geteuid() != 0:
        return "not root: the hub cannot switch accounts"
    if not (shutil.which("useradd") and shutil.which("userdel")):
        return "useradd or userdel is missing"
    return ""


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
    # None: what `make up` does here (accounts as root); False: everyone shares one account
    accounts: bool | None = None
    account_prefix: str = field(default_factory=lambda: f"t{secrets.token_hex(3)}-")
    up_args: list[str] = field(default_factory=list)  # more `gpupool up` options, e.g. ["--demo-culling"]
    python: str = sys.executable  # the installation `gpupool up` runs from (another clone's venv)
    proc: subprocess.Popen | None = None
    requested_state: Path | None = None  # where the test asked for it (kept there: hub.log at cleanup)
    _own_top: Path | None = None

    def __post_init__(self) -> None:
        if self.accounts is None:
            self.accounts = not why_no_accounts() and not self.env.get("GPUPOOL_SPAWNER")
        if self.accounts:
            from gpupool.host.accounts import unreachable

            self.requested_state = self.state
            if unreachable([str(self.state.parent)]):
                # the accounts pass through to their homes in <state>/home: a folder they can reach
                self._own_top = Path(tempfile.mkdtemp(prefix="gpupool-hub-"))
                self._own_top.chmod(0o711)
                self.state = self._own_top / "state"
            _LIVE.append(self)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def log_path(self) -> Path:
        return self.state / "hub.log"

    def account(self, user: str) -> pwd.struct_passwd:
        """The Unix account the hub made for hub user `user` (KeyError: none)."""
        from gpupool.host.accounts import unix_name

        return pwd.getpwnam(unix_name(user, self.account_prefix))

    def write_config(self) -> Path:
        path = self.state / "test_config.py"
        accounts = f"c.SystemAccounts.prefix = {self.account_prefix!r}\n" if self.accounts else ""
        path.write_text(
            textwrap.dedent(f"""
            c.JupyterHub.services = [{{"name": "test-admin", "api_token": "{ADMIN_TOKEN}"}}]
            c.JupyterHub.load_roles = [{{"name": "admin", "services": ["test-admin"]}}]
            c.JupyterHub.last_activity_interval = 5
            c.Spawner.poll_interval = 1
            c.Spawner.start_timeout = 120
            c.Spawner.http_timeout = 120
        """)
            + accounts
            + textwrap.dedent(self.extra_config)
        )
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
            GPUPOOL_DEMO_PASSWORD=PASSWORD,
            GPUPOOL_DEMO_ADMIN_PASSWORD=ADMIN_PASSWORD,
            PATH=f"{REPO / 'node_modules' / '.bin'}{os.pathsep}{Path(self.python).parent}"
            f"{os.pathsep}{os.environ.get('PATH', '')}",
        )
        env.pop("GPUPOOL_USER_ENV", None)  # `gpupool up` makes the users' environment itself, as root
        if not self.accounts:
            env["GPUPOOL_SPAWNER"] = "gpupool-simple"
        env.update(self.env)
        log = open(self.log_path, "ab")
        # `gpupool up`, as `make up` runs it: the same environment decisions, the same config
        self.proc = subprocess.Popen(
            [
                self.python,
                "-m",
                "gpupool.wiring.cli",
                "up",
                "--state",
                str(self.state),
                "--config",
                str(self.write_config()),
                "--port",
                str(self.port),
                "--hub-port",
                str(self.hub_port),
                "--api-port",
                str(self.api_port),
                "--proxy-api-port",
                str(self.proxy_api_port),
                *self.up_args,
            ],
            cwd=self.state,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=_terminal_signals,
        )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"hub exited with {self.proc.returncode}:\n{self.tail()}")
            try:
                self.api("GET", "/hub/api/")
                self.api("GET", "/services/gpupool/api/pool")
                break
            except (OSError, urllib.error.URLError):
                time.sleep(0.3)
        else:
            raise RuntimeError(f"hub did not answer in {timeout}s:\n{self.tail()}")
        if self.accounts:  # the banner says whose account users run as: never silently shared
            while "gpupool: embedded hub ready" not in self.tail(400):
                if time.monotonic() > deadline + 30 or self.proc.poll() is not None:
                    raise RuntimeError(f"no banner from gpupool up:\n{self.tail()}")
                time.sleep(0.2)
            if ACCOUNTS_BANNER not in self.tail(400):
                raise RuntimeError(f"the hub does not give users accounts of their own:\n{self.tail()}")
        return self

    def hub_pid(self) -> int:
        """The JupyterHub process (`gpupool up`'s child)."""
        assert self.proc is not None
        for task in Path(f"/proc/{self.proc.pid}/task").iterdir():
            children = (task / "children").read_text().split()
            if children:
                return int(children[0])
        raise AssertionError(f"gpupool up has no hub process:\n{self.tail()}")

    def tail(self, lines: int = 60) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def wait_job(self, job_id: str, states: set[str], token: str, timeout: float = 120) -> dict:
        """Poll a train job through the gpupool API until it reaches one of `states`."""
        last: dict = {}

        def reached() -> dict | None:
            last.update(self.api("GET", f"/services/gpupool/api/jobs/{job_id}", token=token))
            return dict(last) if last["state"] in states else None

        return until(
            reached,
            f"job {job_id} to reach {sorted(states)}",
            timeout=timeout,
            detail=lambda: f"now {last.get('state')}:\n{self.tail()}",
        )

    def kill9(self) -> None:
        """Crash the hub process only (servers and the proxy survive, as in a real crash)."""
        assert self.proc is not None
        os.kill(self.hub_pid(), signal.SIGKILL)
        self.proc.wait()

    def stop(self) -> None:
        """Stop the hub, its proxy and every server it started (the test's whole process group)."""
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)  # `gpupool up` hands it to the hub
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        self.kill_leftovers()
        self.proc = None

    def end_now(self) -> None:
        """Kill `gpupool up`, the hub and whatever they started (no graceful stop)."""
        if self.proc is None:
            return
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)  # its own session: `gpupool up` and the hub
            self.proc.wait(30)
        self.kill_leftovers()
        self.proc = None

    def cleanup(self) -> None:
        """After the test: the accounts this hub made go (their processes first), and a state
        folder of its own with them, its hub.log kept where the test asked for the state.

        The hub is killed, not stopped: after the test nothing is asserted about how it stops
        (tests/test_hub_stop.py and the tests that restart a hub call `stop()` themselves), and
        a graceful stop waits for JupyterHub to stop every server one by one — seconds per
        JupyterLab, more on a loaded machine — before `kill_leftovers` ends the rest anyway."""
        self.end_now()
        if not self.accounts or self not in _LIVE:
            return
        _LIVE.remove(self)
        remove_accounts(self.state)
        if self._own_top is not None:
            if self.requested_state is not None and self.log_path.exists():
                self.requested_state.mkdir(parents=True, exist_ok=True)
                shutil.copy(self.log_path, self.requested_state / "hub.log")
            shutil.rmtree(self._own_top, ignore_errors=True)

    def kill_leftovers(self) -> None:
        """Servers and proxy run in their own sessions; find them by the state folder."""
        self.kill_cgroups()
        out = subprocess.run(["ps", "-ww", "-eo", "pid,args"], capture_output=True, text=True).stdout
        # -ww: ps cuts lines at $COLUMNS when it is set (pytest sets it), hiding the state folder
        for line in out.splitlines()[1:]:
            pid, _, args = line.strip().partition(" ")
            # the culler service names the hub's gpupool API port on its command line
            if (
                str(self.state) in args
                or f"127.0.0.1:{self.proxy_api_port}" in args
                or (f"127.0.0.1:{self.api_port}/" in args and "gpupool.idle_culler" in args)
                or ("configurable-http-proxy" in args and f"--port {self.port}" in args)
            ):
                try:
                    os.kill(int(pid), signal.SIGKILL)
                except (ProcessLookupError, ValueError):
                    pass
        # servers run in HOME under the state folder, and carry the hub's key (shared-account
        # servers too, whose HOME is the test's); check their environment too
        from gpupool.contain import hub_key
        from gpupool.host.instance import HUB_VAR

        marker = f"{HUB_VAR}={hub_key(f'sqlite:///{self.state}/gpupool.sqlite')}\0".encode()
        for proc in Path("/proc").iterdir():
            if not proc.name.isdigit():
                continue
            try:
                environ = (proc / "environ").read_bytes()
            except OSError:
                continue
            if (
                f"GPUPOOL_STATE_DIR={self.state}".encode() in environ
                or f"HOME={self.state}/home/".encode() in environ
                or marker in environ
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
        tree.remove_root()  # in every hierarchy (freezer, devices, memory, pids, cpu)

    # --- HTTP ----------------------------------------------------------------
    def api(
        self, method: str, path: str, body: Any = None, token: str = ADMIN_TOKEN, timeout: float = 30
    ) -> Any:
        """Call the hub or gpupool API; returns parsed JSON, raises HTTPError on 4xx/5xx."""
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(
            self.url + path, data=data, method=method, headers={"Authorization": f"token {token}"}
        )
        with urllib.request.urlopen(req, timeout=timeout) as r:
            text = r.read().decode()
        return json.loads(text) if text else None

    def api_error(
        self, method: str, path: str, body: Any = None, token: str = ADMIN_TOKEN
    ) -> tuple[int, str]:
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
        def ready() -> dict | None:
            s = self.api("GET", f"/hub/api/users/{name}").get("servers", {}).get(server)
            if not s:
                raise AssertionError(f"{name}/{server} is gone:\n{self.tail()}")
            return s if s.get("ready") else None

        return until(ready, f"{name}/{server} ready", timeout=timeout, every=0.3, detail=self.tail)

    def stop_server(self, name: str, server: str = "", timeout: float = 60) -> None:
        path = f"/hub/api/users/{name}/servers/{server}" if server else f"/hub/api/users/{name}/server"
        self.api("DELETE", path)
        until(
            lambda: not self.api("GET", f"/hub/api/users/{name}").get("servers", {}).get(server),
            f"{name}/{server} to stop",
            timeout=timeout,
            every=0.3,
            detail=self.tail,
        )

    def allocations(self) -> list[dict]:
        """Every share, from the gpupool API as an admin sees it."""
        shares = []
        for gpu in self.api("GET", "/services/gpupool/api/pool")["gpus"]:
            for s in gpu["shares"]:
                shares.append({**s, "gpu": gpu["index"], "node": gpu["node"]})
        return shares


_LIVE: list[Hub] = []  # hubs with accounts not yet cleaned up: at the latest when pytest exits
atexit.register(lambda: [h.cleanup() for h in list(_LIVE)])


def uid_of(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("Uid:"):
            return int(line.split()[1])  # real uid
    raise ValueError(f"no Uid in /proc/{pid}/status")


def remove_accounts(state: Path) -> list[str]:
    """The accounts the hub made (gpupool's comment marker, a home in this state folder) go, as
    `gpupool accounts --remove --kill` removes them; the names removed."""
    from gpupool.host.account_cleanup import remove_accounts as remove

    removed, problems = remove(str(state), kill=True)
    assert not problems, problems
    return removed


class WebUser:
    """A hub user as a browser is one: a cookie jar, the log-in form, the spawn form."""

    def __init__(self, hub_url: str, name: str) -> None:
        self.url, self.name = hub_url, name
        self.jar = http.cookiejar.CookieJar()
        self.opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(self.jar))

    def xsrf(self) -> str:
        return [c.value for c in self.jar if c.name == "_xsrf" and c.path.startswith("/hub")][-1]

    def get(self, path: str, timeout: float = 60) -> tuple[int, str, str]:
        """(status, final URL, body) of a GET, redirects followed."""
        try:
            with self.opener.open(self.url + path, timeout=timeout) as r:
                return r.status, r.geturl(), r.read().decode(errors="replace")
        except urllib.error.HTTPError as err:
            return err.code, err.geturl(), err.read().decode(errors="replace")

    def post_form(self, path: str, form: dict[str, str], timeout: float = 60) -> tuple[int, str, str]:
        data = urllib.parse.urlencode({**form, "_xsrf": self.xsrf()}).encode()
        try:
            with self.opener.open(self.url + path, data=data, timeout=timeout) as r:
                return r.status, r.geturl(), r.read().decode(errors="replace")
        except urllib.error.HTTPError as err:
            return err.code, err.geturl(), err.read().decode(errors="replace")

    def log_in(self, password: str) -> None:
        self.get("/hub/login")
        status, url, body = self.post_form(
            "/hub/login?next=/hub/home", {"username": self.name, "password": password}
        )
        assert any(c.name.startswith("jupyterhub-hub-login") for c in self.jar), (status, url, body[-500:])

    def spawn(self, gpus: str, server: str = "", timeout: float = 120) -> str:
        """Submit the spawn form and follow the hub to the server; the page the user lands on."""
        path = f"/hub/spawn/{self.name}" + (f"/{server}" if server else "")
        self.get(path)
        status, url, body = self.post_form(path, {"gpus": gpus})
        assert status == 200, (status, url, body[-2000:])
        page = [url]  # the hub's progress page, until the server is up

        def landed() -> str | None:
            if "/spawn-pending/" not in page[0]:
                return page[0]
            page[0] = self.get(page[0].removeprefix(self.url))[1]
            return None

        return until(landed, f"{self.name}'s spawn to leave the pending page", timeout=timeout, every=1)


def page_config(html: str) -> dict:
    """The JSON JupyterLab's page carries (#jupyter-config-data): its extensions, its base URL."""
    found = re.search(r'<script id="jupyter-config-data" type="application/json">(.*?)</script>', html, re.S)
    return json.loads(found.group(1)) if found else {}


def progress_messages(hub: Hub, user: str, timeout: float = 120) -> list[str]:
    """The spawn page's progress messages (the event stream it reads), from the moment the spawn
    is pending until it is ready or failed."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        req = urllib.request.Request(
            f"{hub.url}/hub/api/users/{user}/server/progress",
            headers={"Authorization": f"token {ADMIN_TOKEN}"},
        )
        try:
            stream = urllib.request.urlopen(req, timeout=timeout)
        except urllib.error.HTTPError:  # not pending yet
            time.sleep(0.1)
            continue
        said = []
        with stream:
            for line in stream:
                if line.startswith(b"data:"):
                    event = json.loads(line[5:])
                    said.append(event.get("message", ""))
                    if event.get("ready") or event.get("failed"):
                        return said
        return said
    raise AssertionError(f"no progress for {user}:\n{hub.tail()}")
