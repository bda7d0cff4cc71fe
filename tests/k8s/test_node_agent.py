"""The node agent maps GPU processes to pods through /proc/<pid>/cgroup and serves them; NVML is
faked at the adapter boundary (gpupool.gpu.nvml), /proc is a temp tree."""

from __future__ import annotations

import json
import threading
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from gpupool.gpu.nvml import DeviceSample, NVMLUnavailable, ProcessSample
from gpupool.idle_culler.node_agent.cgroups import pod_uid
from gpupool.idle_culler.node_agent.server import Agent, serve
from gpupool.idle_culler.sampler import NodeAgentSampler, Target

UID = "0f3c2a1b-1111-4c2d-9e8f-0123456789ab"
UID2 = "7d9e1c2b-2222-4a3b-8c7d-fedcba987654"
U = UID.replace("-", "_")


@pytest.mark.parametrize(
    "line",
    [
        # cgroup v2, systemd driver (kubeadm, GKE, EKS)
        f"0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{U}.slice/cri-containerd-5e1f.scope",
        # cgroup v1, cgroupfs driver (k3s, older kind)
        f"12:memory:/kubepods/burstable/pod{UID}/6b0b2c7e8d",
        f"11:devices:/kubepods/besteffort/pod{UID}/6b0b2c7e8d",
        # guaranteed QoS has no QoS level in the path
        f"0::/kubepods/pod{UID}/abc",
        f"0::/kubepods.slice/kubepods-pod{U}.slice/cri-o-1.scope",
        # cgroup v2 seen from the agent's own cgroup namespace: relative to it
        f"0::/../../kubepods-besteffort-pod{U}.slice/cri-containerd-77aa.scope",
        # cgroup v1 systemd with docker
        f"4:cpu,cpuacct:/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{U}.slice/docker-1.scope",
    ],
)
def test_pod_uid_from_real_cgroup_lines(line: str) -> None:
    assert pod_uid("1:name=systemd:/user.slice\n" + line + "\n") == UID


@pytest.mark.parametrize(
    "text",
    [
        "0::/user.slice/user-1000.slice/session-3.scope\n",
        "0::/system.slice/containerd.service\n",
        "0::/kubepods.slice/kubepods-burstable.slice\n",  # a QoS slice, no pod
        "",
    ],
)
def test_processes_outside_pods_are_not_attributed(text: str) -> None:
    assert pod_uid(text) is None


class FakeNVML:
    """gpupool.gpu.nvml.NVML's surface, with samples a test sets."""

    def __init__(self) -> None:
        self.processes = [
            ProcessSample(11, "GPU-a", 40, 1000),
            ProcessSample(12, "GPU-a", 70, 500),
            ProcessSample(13, "GPU-b", 5, 100),
            ProcessSample(14, "GPU-b", 30, 2000),
        ]
        self.devices = [DeviceSample("GPU-a", 100, 1600, 81920), DeviceSample("GPU-b", 35, 2100, 81920)]
        self.fail = False

    def process_samples(self):
        if self.fail:
            raise NVMLUnavailable("driver went away")
        return self.processes

    def device_samples(self):
        return self.devices


@pytest.fixture
def proc(tmp_path: Path) -> Path:
    """A /proc with two processes of one pod, one of another, and one of the host."""
    for pid, text in (
        (11, f"0::/kubepods/burstable/pod{UID}/c1\n"),
        (12, f"0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{U}.slice/c2\n"),
        (13, "0::/system.slice/sshd.service\n"),
        (14, f"0::/kubepods/besteffort/pod{UID2}/c3\n"),
    ):
        (tmp_path / str(pid)).mkdir()
        (tmp_path / str(pid) / "cgroup").write_text(text)
    return tmp_path


@pytest.fixture
def served(proc: Path):
    nvml = FakeNVML()
    agent = Agent(nvml, proc, clock=lambda: 1000.0)
    server = serve(agent, 0, host="127.0.0.1")
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield agent, nvml, f"http://127.0.0.1:{server.server_port}"
    server.shutdown()
    server.server_close()


def get(url: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as err:
        return err.code, err.read()


def test_serves_per_pod_json_and_metrics(served) -> None:
    agent, _, base = served
    assert get(f"{base}/pods")[0] == 503  # nothing sampled yet: say so rather than "idle"
    agent.refresh()
    pods = json.loads(get(f"{base}/pods")[1])["pods"]
    # pod 1: two processes on GPU-a add up (40 + 70, capped at 100); pod 2 alone on GPU-b; sshd not a pod
    assert pods == [
        {"uid": UID, "gpu_util_pct": 100.0, "memory_mib": 1500, "gpus": ["GPU-a"]},
        {"uid": UID2, "gpu_util_pct": 30.0, "memory_mib": 2000, "gpus": ["GPU-b"]},
    ]
    metrics = get(f"{base}/metrics")[1].decode()
    assert f'gpupool_pod_gpu_memory_mib{{pod_uid="{UID}"}} 1500.0' in metrics
    assert f'gpupool_pod_gpu_utilization_pct{{pod_uid="{UID2}"}} 30.0' in metrics
    assert 'gpupool_gpu_memory_used_mib{gpu="GPU-b"} 2100.0' in metrics
    assert "gpupool_node_agent_nvml_up 1.0" in metrics
    assert get(f"{base}/healthz") == (200, b"ok")


def test_every_reader_sees_the_same_sample_window(served) -> None:
    agent, nvml, base = served
    agent.refresh()
    first = json.loads(get(f"{base}/pods")[1])
    get(f"{base}/metrics")  # Prometheus scrapes in between
    nvml.processes = []  # NVML would now report nothing for a second reader
    assert json.loads(get(f"{base}/pods")[1]) == first


def test_an_nvml_failure_keeps_the_last_sample_and_is_reported(served) -> None:
    agent, nvml, base = served
    agent.refresh()
    nvml.fail = True
    agent.refresh()
    body = json.loads(get(f"{base}/pods")[1])
    assert body["error"] == "NVML: driver went away" and len(body["pods"]) == 2
    assert get(f"{base}/healthz")[0] == 503
    assert "gpupool_node_agent_nvml_up 0.0" in get(f"{base}/metrics")[1].decode()


def test_the_cullers_node_agent_sampler_reads_the_agent(served) -> None:
    agent, _, base = served
    agent.refresh()
    target = Target(owner="ann", name="", pod_uid=UID)
    use = NodeAgentSampler([f"{base}/pods"]).sample([target])
    assert use["ann/"].util_pct == 100.0 and use["ann/"].memory_mib == 1500


def test_a_pod_that_never_opened_cuda_is_reported_idle_not_missing(proc: Path) -> None:
    """Its processes are on the node (in /proc) but none holds a GPU context: 0 %, 0 MiB, so the
    culler's GPU rules apply to it instead of treating it as 'no data'."""
    nvml = FakeNVML()
    nvml.processes = [p for p in nvml.processes if p.pid == 14]  # only UID2 runs CUDA
    snap = Agent(nvml, proc, clock=lambda: 1000.0).refresh()
    pods = {p["uid"]: p for p in snap["pods"]}
    assert pods[UID] == {"uid": UID, "gpu_util_pct": 0.0, "memory_mib": 0, "gpus": []}
    assert pods[UID2]["gpu_util_pct"] == 30.0
    assert len(pods) == 2  # the host's process (pid 13) is no pod


def test_the_sampler_asks_every_agent_behind_a_headless_service(proc: Path) -> None:
    """Two agents (two nodes) on one port; the Service name resolves to both, as the chart's
    headless Service does; a third address that does not answer is skipped."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    servers = []
    for host, processes in (
        ("127.0.0.1", [(11, "GPU-a", 40, 1000)]),
        ("127.0.0.2", [(14, "GPU-b", 30, 2000)]),
    ):
        nvml = FakeNVML()
        nvml.processes = [p for p in nvml.processes if (p.pid, p.gpu_uuid) == processes[0][:2]]
        node_proc = proc / host  # each node's /proc holds its own pods' processes only
        node_proc.mkdir()
        (node_proc / str(processes[0][0])).symlink_to(proc / str(processes[0][0]))
        agent = Agent(nvml, node_proc, clock=lambda: 1000.0)
        agent.refresh()
        server = serve(agent, port, host=host)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)
    try:
        resolved = {"gpupool-node-agent.gpupool": ["127.0.0.1", "127.0.0.2", "127.0.0.3"]}
        sampler = NodeAgentSampler(
            [f"http://gpupool-node-agent.gpupool:{port}/pods"],
            timeout=1,
            resolve=lambda host, _port: resolved[host],
        )
        use = sampler.sample([Target("ann", "", pod_uid=UID), Target("bob", "", pod_uid=UID2)])
        assert use["ann/"].util_pct == 40.0 and use["bob/"].memory_mib == 2000
    finally:
        for server in servers:
            server.shutdown()
            server.server_close()


def test_on_virtual_gpus_every_pod_on_the_node_is_reported_idle(proc: Path) -> None:
    """--virtual-gpus N (a node without a driver): no NVML, N idle devices, and every pod with a
    process on the node at 0 %, so the culler's GPU rules apply (its fail-safe would otherwise
    wait for Jupyter silence alone); the kubelet's probe says the agent is healthy."""
    from gpupool.gpu.nvml import VirtualGPUs

    agent = Agent(VirtualGPUs(2), proc, clock=lambda: 1000.0)
    snap = agent.refresh()
    assert snap["error"] is None
    assert {p["uid"]: p["gpu_util_pct"] for p in snap["pods"]} == {UID: 0.0, UID2: 0.0}
    assert [g["uuid"] for g in snap["gpus"]] == ["GPU-virtual-0", "GPU-virtual-1"]
    server = serve(agent, 0, host="127.0.0.1")
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        assert get(f"http://127.0.0.1:{server.server_port}/healthz") == (200, b"ok")
    finally:
        server.shutdown()
        server.server_close()


def test_the_chart_passes_virtual_gpus_to_the_agent() -> None:
    from tests.k8s.test_chart import render

    def command(values: dict) -> list[str]:
        ds = next(d for d in render({"nodeAgent": {"token": "t" * 40, **values}}) if d["kind"] == "DaemonSet")
        return ds["spec"]["template"]["spec"]["containers"][0]["command"]

    assert command({"virtualGpus": 2})[-2:] == ["--virtual-gpus", "2"]
    assert "--virtual-gpus" not in command({})
