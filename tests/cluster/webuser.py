"""A user at the hub's front door, over HTTP as a browser goes: the login form, the spawn form,
the single-user server's REST API and a kernel's websocket channel (Jupyter's messaging
protocol, JSON over the websocket), with the hub's cookies and an API token the user made."""

from __future__ import annotations

import asyncio
import json
import uuid
from dataclasses import dataclass, field

import httpx
from tornado.httpclient import HTTPRequest
from tornado.websocket import websocket_connect

from tests.support.wait import until


@dataclass
class WebUser:
    base: str  # http://<node ip>:<proxy-public's node port>
    name: str
    password: str
    web: httpx.Client = field(init=False)
    token: str = ""

    def __post_init__(self) -> None:
        self.web = httpx.Client(base_url=self.base, timeout=30, follow_redirects=False)

    def close(self) -> None:
        self.web.close()

    def xsrf(self) -> str:
        return self.web.cookies.get("_xsrf", path="/hub/") or self.web.cookies.get("_xsrf") or ""

    def login(self) -> None:
        r = self.web.get("/hub/login")
        assert r.status_code == 200, r.text[:500]
        r = self.web.post(
            "/hub/login", data={"username": self.name, "password": self.password, "_xsrf": self.xsrf()}
        )
        assert r.status_code == 302, f"login refused: {r.status_code} {r.text[:500]}"
        r = self.web.post(
            f"/hub/api/users/{self.name}/tokens",
            json={"note": "test", "expires_in": 3600},
            headers={"X-XSRFToken": self.xsrf()},
        )
        assert r.status_code in (200, 201), r.text[:500]
        self.token = r.json()["token"]

    def api(self, method: str, path: str, **kw) -> httpx.Response:
        return self.web.request(method, path, headers={"Authorization": f"token {self.token}"}, **kw)

    def spawn_form(self, **fields: str) -> httpx.Response:
        """Submits the spawn form, as the browser does."""
        return self.web.post(f"/hub/spawn/{self.name}", data={**fields, "_xsrf": self.xsrf()})

    def server(self) -> dict:
        r = self.api("GET", f"/hub/api/users/{self.name}")
        r.raise_for_status()
        return (r.json().get("servers") or {}).get("", {})

    def wait_ready(self, timeout: float = 300) -> dict:
        def ready() -> dict | None:
            server = self.server()
            if server.get("ready"):
                return server
            if not server.get("pending") and server != {}:
                raise AssertionError(f"the server stopped while starting: {server}")
            return None

        return until(ready, f"the server of {self.name} to be ready", timeout=timeout, every=1)

    # --- the single-user server ----------------------------------------------------------
    def lab(self, path: str = "lab") -> httpx.Response:
        return self.api("GET", f"/user/{self.name}/{path}")

    def execute(self, *cells: str, timeout: float = 120) -> str:
        """Runs `cells` one after another in a new kernel of the user's server; returns what the
        last printed (stdout, stderr, results), or raises with the traceback."""
        r = self.api("POST", f"/user/{self.name}/api/kernels", json={"name": "python3"})
        assert r.status_code == 201, r.text[:500]
        kernel = r.json()["id"]
        try:
            out = ""
            for code in cells:
                out = asyncio.run(self._execute(kernel, code, timeout))
            return out
        finally:
            self.api("DELETE", f"/user/{self.name}/api/kernels/{kernel}")

    def open_notebook(self, path: str) -> str:
        """Opens the notebook `path` as JupyterLab does (a session, whose kernel knows its
        notebook: what hibernation keys its state on); returns the kernel's id, left running."""
        r = self.api(
            "POST",
            f"/user/{self.name}/api/sessions",
            json={"path": path, "name": path, "type": "notebook", "kernel": {"name": "python3"}},
        )
        assert r.status_code == 201, r.text[:500]
        return r.json()["kernel"]["id"]

    def run(self, kernel: str, code: str, timeout: float = 120) -> str:
        """Runs one cell in a running kernel (see execute)."""
        return asyncio.run(self._execute(kernel, code, timeout))

    async def _execute(self, kernel: str, code: str, timeout: float) -> str:
        url = self.base.replace("http", "ws", 1) + f"/user/{self.name}/api/kernels/{kernel}/channels"
        ws = await websocket_connect(HTTPRequest(url, headers={"Authorization": f"token {self.token}"}))
        msg_id = uuid.uuid4().hex
        ws.write_message(
            json.dumps(
                {
                    "header": {
                        "msg_id": msg_id,
                        "username": self.name,
                        "session": uuid.uuid4().hex,
                        "msg_type": "execute_request",
                        "version": "5.3",
                        "date": "",
                    },
                    "parent_header": {},
                    "metadata": {},
                    "channel": "shell",
                    "content": {
                        "code": code,
                        "silent": False,
                        "store_history": False,
                        "user_expressions": {},
                        "allow_stdin": False,
                        "stop_on_error": True,
                    },
                }
            )
        )
        out, error = [], None
        loop_deadline = asyncio.get_running_loop().time() + timeout
        try:
            while True:
                left = loop_deadline - asyncio.get_running_loop().time()
                if left <= 0:
                    raise AssertionError(
                        f"the kernel did not finish in {timeout:.0f} s; output so far: {''.join(out)}"
                    )
                raw = await asyncio.wait_for(ws.read_message(), left)
                if raw is None:
                    raise AssertionError("the kernel's websocket closed")
                msg = json.loads(raw)
                if msg.get("parent_header", {}).get("msg_id") != msg_id:
                    continue
                kind, content = msg["msg_type"], msg["content"]
                if kind == "stream":
                    out.append(content["text"])
                elif kind in ("execute_result", "display_data"):
                    out.append(content["data"].get("text/plain", "") + "\n")
                elif kind == "error":
                    error = "\n".join(content["traceback"])
                elif kind == "status" and content["execution_state"] == "idle":
                    break
        finally:
            ws.close()
        if error:
            raise AssertionError(f"the cell failed:\n{error}\noutput: {''.join(out)}")
        return "".join(out)
