"""The agent: samples NVML every `interval_s` in one thread and serves the last snapshot, so
every reader (the culler's /pods, Prometheus' /metrics) sees the same window; reading NVML
per request would split its per-process samples between the readers.

/pods and /metrics tell which pods idle on which GPUs: they answer only a request carrying the
chart's shared token (`Authorization: Bearer <token>`): 401 without one, 403 with another.
/healthz stays open for the kubelet's probe (it says only whether NVML answers)."""

from __future__ import annotations

import hmac
import json
import logging
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from prometheus_client import CollectorRegistry, Gauge, generate_latest

from gpupool.idle_culler.node_agent.cgroups import pod_of, pods_on_node
from gpupool.idle_culler.node_agent.collect import per_gpu, per_pod
from gpupool.vocab.agent_wire import AgentSnapshot

log = logging.getLogger("gpupool.node_agent")


class Agent:
    def __init__(self, nvml, proc: Path = Path("/proc"), clock: Callable[[], float] = time.time) -> None:
        self.nvml, self.proc, self.clock = nvml, Path(proc), clock
        self.snapshot: AgentSnapshot = {"time": None, "error": "no sample yet", "pods": [], "gpus": []}
        self.lock = threading.Lock()

    def refresh(self) -> AgentSnapshot:
        try:
            pods = per_pod(self.nvml.process_samples(), lambda pid: pod_of(pid, self.proc))
            using = {p["uid"] for p in pods}
            pods += [
                {"uid": uid, "gpu_util_pct": 0.0, "memory_mib": 0, "gpus": []}  # never opened CUDA
                for uid in sorted(pods_on_node(self.proc) - using)
            ]
            snap: AgentSnapshot = {
                "time": self.clock(),
                "error": None,
                "pods": pods,
                "gpus": per_gpu(self.nvml.device_samples()),
            }
        except Exception as err:  # noqa: BLE001 - NVML failed: say so, keep serving
            log.warning("NVML sample failed: %s", err)
            snap = {**self.snapshot, "error": f"NVML: {err}"}  # the last good sample, said old
        with self.lock:
            self.snapshot = snap
        return snap

    def fail(self, error: str) -> None:
        """No sample can be taken (NVML did not open): say so, keep serving."""
        with self.lock:
            self.snapshot = {**self.snapshot, "error": error}

    def current(self) -> AgentSnapshot:
        with self.lock:
            return self.snapshot

    def metrics(self) -> bytes:
        snap = self.current()
        reg = CollectorRegistry()
        util = Gauge(
            "gpupool_pod_gpu_utilization_pct",
            "SM use of the pod's processes (busiest GPU)",
            ["pod_uid"],
            registry=reg,
        )
        mem = Gauge(
            "gpupool_pod_gpu_memory_mib", "GPU memory held by the pod's processes", ["pod_uid"], registry=reg
        )
        gutil = Gauge("gpupool_gpu_utilization_pct", "Device utilization", ["gpu"], registry=reg)
        gmem = Gauge("gpupool_gpu_memory_used_mib", "Device memory in use", ["gpu"], registry=reg)
        up = Gauge("gpupool_node_agent_nvml_up", "1 when the last NVML sample succeeded", registry=reg)
        for p in snap["pods"]:
            util.labels(p["uid"]).set(p["gpu_util_pct"])
            mem.labels(p["uid"]).set(p["memory_mib"])
        for g in snap["gpus"]:
            gutil.labels(g["uuid"]).set(g["util_pct"])
            gmem.labels(g["uuid"]).set(g["memory_used_mib"])
        up.set(0 if snap["error"] else 1)
        return generate_latest(reg)

    def sample_forever(self, interval_s: float, stop: threading.Event) -> None:
        while not stop.is_set():
            self.refresh()
            stop.wait(interval_s)


def make_handler(agent: Agent, token: Callable[[], str | None]) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            path = self.path.split("?", 1)[0]
            if path in ("/pods", "/metrics") and not self.authorized():
                return None
            snap = agent.current()
            if path == "/pods":
                if snap["error"] and snap["time"] is None:
                    return self.send(503, json.dumps({"error": snap["error"]}).encode(), "application/json")
                return self.send(200, json.dumps(snap).encode(), "application/json")
            if path == "/metrics":
                return self.send(200, agent.metrics(), "text/plain; version=0.0.4")
            if path == "/healthz":
                error = snap["error"]
                if error is not None:
                    return self.send(503, error.encode(), "text/plain")
                return self.send(200, b"ok", "text/plain")
            self.send(404, b"use /pods, /metrics or /healthz", "text/plain")

        def authorized(self) -> bool:
            expected = token()
            if expected is None:  # started with --no-token: anyone on the network may read
                return True
            scheme, _, given = (self.headers.get("Authorization") or "").partition(" ")
            if scheme.lower() != "bearer" or not given:
                self.send(
                    401,
                    b"a bearer token is required",
                    "text/plain",
                    {"WWW-Authenticate": 'Bearer realm="gpupool-node-agent"'},
                )
                return False
            if not expected or not hmac.compare_digest(given.strip().encode(), expected.encode()):
                self.send(403, b"wrong token", "text/plain")
                return False
            return True

        def send(self, code: int, body: bytes, ctype: str, headers: dict[str, str] | None = None) -> None:
            self.send_response(code)
            for key, value in (headers or {}).items():
                self.send_header(key, value)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args) -> None:
            pass

    return Handler


def file_token(path: Path) -> Callable[[], str]:
    """The token as the mounted Secret holds it now (read per request: a rotated Secret applies
    without a restart); "" (every request refused) while the file cannot be read."""

    def read() -> str:
        try:
            return path.read_text().strip()
        except OSError as err:
            log.error("cannot read the token file %s: %s", path, err)
            return ""

    return read


def serve(
    agent: Agent, port: int, host: str = "0.0.0.0", token: Callable[[], str | None] = lambda: None
) -> ThreadingHTTPServer:
    """`token` gives the token requests must carry, None for none (tests of the data alone)."""
    return ThreadingHTTPServer((host, port), make_handler(agent, token))
