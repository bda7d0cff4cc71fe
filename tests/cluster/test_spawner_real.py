"""GPUKubeSpawner against the real kube-apiserver, as the hub's service account: kubespawner's
own code creates the pod, the scheduler binds it to a kwok GPU node, kwok runs it (no code runs
inside), kubespawner sees it ready; stop deletes it and the share goes back to the pool.

The binding here is kube-scheduler's `kai-scheduler` stand-in profile (plane.py), so the
gpu-fraction is checked as admitted on the pod; KAI-Scheduler's own binding onto a device with its
reservation pod is in test_kai_real.py."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

import pytest

from gpupool.gpu.nvml import DeviceSample
from gpupool.idle_culler.node_agent.server import Agent, serve
from gpupool.idle_culler.sampler import NodeAgentSampler, Target
from tests.cluster.conftest import HUB_NS
from tests.cluster.resources import Resources


@pytest.fixture
async def spawner(make_spawner):  # kubespawner's clients need the running loop
    return make_spawner("ann")


class NoGPUProcesses:
    """NVML where no process holds a GPU context (gpupool.gpu.nvml's surface; no GPU here)."""

    def process_samples(self) -> list:
        return []

    def device_samples(self) -> list:
        return [DeviceSample("GPU-0", 0, 0, 81559)]


def culler_sample(tmp_path: Path, uid: str):
    """The culler's NodeAgentSampler asking a real node agent over HTTP about the pod."""
    proc = tmp_path / "proc"
    (proc / "4242").mkdir(parents=True)
    slice_uid = uid.replace("-", "_")  # systemd cgroup driver, as kubeadm sets up the kubelet
    (proc / "4242" / "cgroup").write_text(
        f"0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{slice_uid}.slice/cri-containerd-1.scope\n"
    )
    agent = Agent(NoGPUProcesses(), proc)
    agent.refresh()
    server = serve(agent, 0, host="127.0.0.1")
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://agents.test:{server.server_address[1]}/pods"
        sampler = NodeAgentSampler([url], timeout=5, resolve=lambda _host, _port: ["127.0.0.1"])
        return sampler.sample([Target("ann", "", pod_uid=uid)])["ann/"]
    finally:
        server.shutdown()
        server.server_close()


async def test_a_quarter_gpu_workspace_runs_with_the_pods_own_environment(
    spawner, admin: Resources, tmp_path: Path
) -> None:
    url = await asyncio.wait_for(spawner.start(), 90)
    assert url
    pod = admin.get(f"/api/v1/namespaces/{HUB_NS}/pods/{spawner.pod_name}")
    assert pod["status"]["phase"] == "Running" and pod["spec"]["nodeName"].startswith("gpu-node-")
    assert pod["spec"]["schedulerName"] == "kai-scheduler"
    assert pod["spec"]["priority"] == 100  # the build class, resolved by admission
    assert pod["metadata"]["annotations"]["gpu-fraction"] == "0.25"
    assert pod["metadata"]["labels"]["kai.scheduler/queue"] == "default"
    env = {e["name"]: e.get("value") for e in pod["spec"]["containers"][0]["env"]}
    assert env["GPUPOOL_GPU_FRACTION"] == "0.25"
    assert not {"CUDA_VISIBLE_DEVICES", "PYTHONPATH", "CUDA_MPS_PIPE_DIRECTORY", "GPUPOOL_GPU_UUIDS"} & set(
        env
    )
    assert [a.total_milli for a in spawner.pool.store.allocations(owner="ann")] == [250]
    assert await spawner.poll() is None
    assert spawner.pod_uid() == pod["metadata"]["uid"]  # what the culler asks the node agents about
    # the culler's view: the node agent on its node (its /proc holds the pod's process, NVML shows
    # no GPU process: the notebook never opened CUDA) reports it idle, not missing
    use = culler_sample(tmp_path, spawner.pod_uid())
    assert (use.util_pct, use.memory_mib) == (0.0, 0)

    await spawner.stop()
    assert admin.get(f"/api/v1/namespaces/{HUB_NS}/pods/{spawner.pod_name}") is None
    assert spawner.pool.store.allocations(owner="ann") == []
