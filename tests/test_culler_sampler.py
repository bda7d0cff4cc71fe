"""GPU samples reach the right workspace: through the server's process tree (embedded),
device use for whole GPUs, or the node agent's per-pod JSON (Kubernetes)."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path

from gpupool.gpu.nvml import DeviceSample, NVMLUnavailable, ProcessSample
from gpupool.idle_culler.sampler import NodeAgentSampler, NVMLSampler, Target, descendants


def fake_proc(root: Path, tree: dict[int, int]) -> Path:
    for pid, ppid in tree.items():
        (root / str(pid)).mkdir(parents=True)
        (root / str(pid) / "stat").write_text(f"{pid} (python (kernel)) S {ppid} 1 1 0")
    return root


class FakeNVML:
    def __init__(self, fail: bool = False) -> None:
        self.fail = fail

    def open(self) -> None:
        if self.fail:
            raise NVMLUnavailable("driver gone")

    def process_samples(self):
        return [
            ProcessSample(101, "GPU-a", 60, 3000),
            ProcessSample(102, "GPU-a", 10, 500),
            ProcessSample(201, "GPU-a", 0, 100),
        ]

    def device_samples(self):
        return [DeviceSample("GPU-b", 97, 70000, 81559)]


def test_processes_count_for_the_workspace_whose_server_started_them(tmp_path: Path) -> None:
    # server 100 -> kernel 101 -> worker 102; server 200 -> kernel 201; 300 unrelated
    proc = fake_proc(tmp_path, {100: 1, 101: 100, 102: 101, 200: 1, 201: 200, 300: 1})
    assert descendants(100, proc) == {100, 101, 102}
    sampler = NVMLSampler(FakeNVML(), proc)
    out = sampler.sample(
        [
            Target("ann", "", pid=100),
            Target("bob", "", pid=200),
            Target("cy", "big", pid=300, gpu_uuids=("GPU-b",), whole_gpus=True),
        ]
    )
    assert (out["ann/"].util_pct, out["ann/"].memory_mib) == (60, 3500)
    assert (out["bob/"].util_pct, out["bob/"].memory_mib) == (0, 100)
    assert (out["cy/big"].util_pct, out["cy/big"].memory_mib) == (97, 70000)


def test_nvml_failure_gives_no_data_rather_than_zero_use(tmp_path: Path) -> None:
    sampler = NVMLSampler(FakeNVML(fail=True), fake_proc(tmp_path, {100: 1}))
    assert sampler.sample([Target("ann", "", pid=100)]) == {}  # missing data never reads as idle


def test_node_agent_json_is_matched_by_pod_uid() -> None:
    body = json.dumps({"pods": [{"uid": "u-1", "gpu_util_pct": 42.5, "memory_mib": 1234}]}).encode()

    class Agent(BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 - http.server's name
            self.send_response(200)
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = HTTPServer(("127.0.0.1", 0), Agent)
    threading.Thread(target=server.handle_request, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_port}/pods"
    out = NodeAgentSampler([url]).sample([Target("ann", "", pod_uid="u-1"), Target("bob", "", pod_uid="u-2")])
    server.server_close()
    assert list(out) == ["ann/"] and (out["ann/"].util_pct, out["ann/"].memory_mib) == (42.5, 1234)
