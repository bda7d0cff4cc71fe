"""Talk to the gpupool API from inside a workspace, with the server's own hub token."""

from __future__ import annotations

import json
import os
import urllib.error
import urllib.request
from typing import Any


class GPUPoolError(RuntimeError):
    """The API refused or could not be reached; the message says what to do."""

    def __init__(self, message: str, status: int = 0) -> None:
        super().__init__(message)
        self.status = status


class Client:
    def __init__(self, api_url: str | None = None, token: str | None = None, timeout: float = 10) -> None:
        self.api_url = (api_url or os.environ.get("GPUPOOL_API_URL", "")).rstrip("/") + "/"
        self.token = token or os.environ.get("JUPYTERHUB_API_TOKEN", "")
        self.timeout = timeout
        if self.api_url == "/":
            raise GPUPoolError("GPUPOOL_API_URL is not set: is this notebook running in a gpupool workspace?")

    def request(self, method: str, path: str, body: object = None) -> object:
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(
            self.api_url + path.lstrip("/"),
            data=data,
            method=method,
            headers={"Authorization": f"token {self.token}", "Content-Type": "application/json"},
        )
        try:
            with urllib.request.urlopen(req, timeout=self.timeout) as r:
                text = r.read().decode()
        except urllib.error.HTTPError as err:
            payload = err.read().decode(errors="replace")
            try:
                message = json.loads(payload).get("message", payload)
            except ValueError:
                message = payload or err.reason
            raise GPUPoolError(f"{message} (HTTP {err.code})", err.code) from None
        except urllib.error.URLError as err:
            raise GPUPoolError(f"cannot reach the gpupool API at {self.api_url}: {err.reason}") from None
        return json.loads(text) if text else None

    def get(self, path: str) -> Any:
        return self.request("GET", path)

    def post(self, path: str, body: object = None) -> Any:
        return self.request("POST", path, body if body is not None else {})
