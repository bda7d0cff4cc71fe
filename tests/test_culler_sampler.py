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


def serve_bodies(bodies: list[bytes]) -> list[str]:
    """One node agent per body, each answering once with it: their URLs."""
    urls = []
    for body in bodies:

        class Agent(BaseHTTPRequestHandler):
            answer = body

            def do_GET(self):  # noqa: N802 - http.server's name
                self.send_response(200)
                self.end_headers()
                self.wfile.write(self.answer)

            def log_message(self, *args):
                pass

        server = HTTPServer(("127.0.0.1", 0), Agent)
        threading.Thread(target=server.handle_request, daemon=True).start()
        urls.append(f"http://127.0.0.1:{server.server_port}/pods")
    return urls


def test_a_broken_node_agent_answer_is_skipped_and_the_pass_goes_on() -> None:
    # an agent of another version, or anything else listening there, answers a wrong shape: its
    # pods give no data (never a crash of the culler's pass, never a made-up reading); the good
    # pods of the same answer and the other agents still count
    good = {"uid": "u-ok", "gpu_util_pct": 30, "memory_mib": 10}
    urls = serve_bodies(
        [
            b"[1, 2]",  # not an object
            json.dumps({"pods": {"u-1": {}}}).encode(),  # not a list
            json.dumps(
                {
                    "pods": [
                        "u-2",
                        {"uid": "u-3", "gpu_util_pct": "busy", "memory_mib": 1},
                        {"uid": "u-4", "gpu_util_pct": float("nan"), "memory_mib": 1},
                        {"uid": "u-5", "gpu_util_pct": 5, "memory_mib": -1},
                        {"uid": ["u-6"], "gpu_util_pct": 5, "memory_mib": 1},
                        good,
                    ]
                }
            ).encode(),
        ]
    )
    targets = [Target(f"user{i}", "", pod_uid=f"u-{i}") for i in range(1, 7)] + [
        Target("ok", "", pod_uid="u-ok")
    ]
    out = NodeAgentSampler(urls).sample(targets)
    assert list(out) == ["ok/"] and (out["ok/"].util_pct, out["ok/"].memory_mib) == (30, 10)
