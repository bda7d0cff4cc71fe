"""python -m idle_culler.node_agent --port 9400"""

from __future__ import annotations

import argparse
import json
import logging
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from prometheus_client import CollectorRegistry, Gauge, generate_latest

from hub_ext.nvml import NVML, NVMLUnavailable

from .cgroups import pod_of

log = logging.getLogger("gpupool.node_agent")


def per_pod(nvml: NVML, proc: Path = Path("/proc")) -> list[dict]:
    pods: dict[str, dict] = {}
    for s in nvml.process_samples():
        uid = pod_of(s.pid, proc)
        if uid is None:
            continue
        p = pods.setdefault(uid, {"uid": uid, "gpu_util_pct": 0.0, "memory_mib": 0, "gpus": []})
        p["gpu_util_pct"] = max(p["gpu_util_pct"], float(s.sm_util_pct))
        p["memory_mib"] += s.memory_mib
        if s.gpu_uuid not in p["gpus"]:
            p["gpus"].append(s.gpu_uuid)
    return list(pods.values())


def make_handler(nvml: NVML, proc: Path):
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            try:
                pods = per_pod(nvml, proc)
            except (NVMLUnavailable, Exception) as err:  # noqa: BLE001 - report, keep serving
                self.send_error(503, f"NVML: {err}")
                return
            if self.path.startswith("/pods"):
                body, ctype = json.dumps({"pods": pods}).encode(), "application/json"
            elif self.path.startswith("/metrics"):
                reg = CollectorRegistry()
                util = Gauge("gpupool_pod_gpu_utilization_pct", "SM use of the pod's processes", ["pod_uid"],
                             registry=reg)
                mem = Gauge("gpupool_pod_gpu_memory_mib", "GPU memory of the pod's processes", ["pod_uid"],
                            registry=reg)
                for p in pods:
                    util.labels(p["uid"]).set(p["gpu_util_pct"])
                    mem.labels(p["uid"]).set(p["memory_mib"])
                body, ctype = generate_latest(reg), "text/plain; version=0.0.4"
            else:
                self.send_error(404, "use /pods or /metrics")
                return
            self.send_response(200)
            self.send_header("Content-Type", ctype)
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args) -> None:
            pass

    return Handler


def serve(port: int, nvml: NVML, proc: Path = Path("/proc"), host: str = "0.0.0.0") -> ThreadingHTTPServer:
    return ThreadingHTTPServer((host, port), make_handler(nvml, proc))


def main() -> int:
    ap = argparse.ArgumentParser(prog="python -m idle_culler.node_agent", description=__doc__)
    ap.add_argument("--port", type=int, default=9400)
    ap.add_argument("--proc", default="/proc")
    args = ap.parse_args()
    nvml = NVML()
    nvml.open()
    serve(args.port, nvml, Path(args.proc)).serve_forever()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
