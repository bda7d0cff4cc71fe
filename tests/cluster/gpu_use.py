"""The one number a node without a GPU cannot give: how busy each pod's GPU is.

The real node's GPUs are virtual (the device plugin's; the node agent runs with
`--virtual-gpus`), so its agent reports every pod GPU-idle. `GPUUseRelay` stands between a
culler and that agent: each `GET /pods` goes on to the real agent pod (found from the endpoints
of the Service the culler was told to ask), with the culler's own token, and the agent's answer
comes back as it is (a refusal too: 401 without the token), except the one field NVML would
fill on a real GPU: a pod the test has not called idle reads busy. Which pods run on the node and
which pod a process belongs to stays the agent's own finding (from /proc and the cgroups).

A workspace pod the agent has not found (yet) reads busy too, in any namespace (the hub's, or a
user's own with user namespaces), so that a culler told to trust this relay never stops another
test's workspace for want of data; `found` keeps what the agent itself reported, for the test to
check."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx

BUSY_PCT = 87.0  # what a training cell's kernel shows in nvidia-smi; any value over the idle threshold


@dataclass
class GPUUseRelay:
    client: Callable[[], httpx.Client]  # the plane's admin client, to find the agent and the pods
    service: str  # "name.namespace:port", the agents' Service as the culler's URL names it
    host: str = "127.0.0.1"
    idle: set[str] = field(default_factory=set)  # pod uids whose GPU is idle (the agent's 0 % stays)
    found: dict[str, float] = field(default_factory=dict)  # uid -> util the agent itself reported, last
    tokens: list[str] = field(default_factory=list)  # the Authorization header of each request
    server: ThreadingHTTPServer | None = None

    @property
    def url(self) -> str:
        assert self.server is not None
        return f"http://{self.host}:{self.server.server_address[1]}/pods"

    def upstream(self) -> list[str]:
        """The ready addresses behind the Service (its EndpointSlices), as the culler's resolver
        would find them in the cluster's DNS."""
        hostport, port = self.service.rsplit(":", 1)
        name, namespace = hostport.split(".", 1)
        with self.client() as http:
            slices = http.get(
                f"/apis/discovery.k8s.io/v1/namespaces/{namespace}/endpointslices",
                params={"labelSelector": f"kubernetes.io/service-name={name}"},
            ).json()["items"]
        return [
            f"http://{address}:{port}/pods"
            for s in slices
            for e in s.get("endpoints") or []
            if (e.get("conditions") or {}).get("ready")
            for address in e["addresses"]
        ]

    def workspace_uids(self) -> set[str]:
        with self.client() as http:
            pods = http.get("/api/v1/pods", params={"labelSelector": "component=singleuser-server"}).json()[
                "items"
            ]
        return {p["metadata"]["uid"] for p in pods}

    def answer(self, auth: str) -> tuple[int, bytes]:
        self.tokens.append(auth)
        headers = {"Authorization": auth} if auth else {}
        pods: dict[str, dict[str, Any]] = {}
        for url in self.upstream():
            r = httpx.get(url, headers=headers, timeout=5)
            if r.status_code != 200:
                return r.status_code, r.content  # the agent's refusal, as the culler would get it
            for p in r.json().get("pods", []):
                self.found[p["uid"]] = p["gpu_util_pct"]
                pods[p["uid"]] = p
        for uid in self.workspace_uids() - pods.keys():
            pods[uid] = {"uid": uid, "gpu_util_pct": 0.0, "memory_mib": 0, "gpus": []}
        for uid, p in pods.items():
            if uid not in self.idle:
                p["gpu_util_pct"], p["memory_mib"] = BUSY_PCT, max(p.get("memory_mib", 0), 1024)
        return 200, json.dumps({"pods": list(pods.values())}).encode()

    def __enter__(self) -> GPUUseRelay:
        relay = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 - http.server's name
                try:
                    code, body = relay.answer(self.headers.get("Authorization", ""))
                except (httpx.HTTPError, ValueError, KeyError) as err:
                    code, body = 502, f"the relay could not ask the agent: {err}".encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer((self.host, 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()
