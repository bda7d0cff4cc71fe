"""The node agent maps GPU processes to pods through /proc/<pid>/cgroup and serves them."""

from __future__ import annotations

import json
import threading
import urllib.request
from pathlib import Path

import pytest

from hub_ext.nvml import ProcessSample
from idle_culler.node_agent.__main__ import serve
from idle_culler.node_agent.cgroups import pod_uid

UID = "0f3c2a1b-1111-4c2d-9e8f-0123456789ab"


@pytest.mark.parametrize("line", [
    f"0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UID.replace('-', '_')}.slice/"
    "cri-containerd-5e1f.scope",  # cgroup v2, systemd driver
    f"12:memory:/kubepods/burstable/pod{UID}/6b0b2c7e8d",  # cgroup v1, cgroupfs driver
    f"0::/kubepods/pod{UID}/abc",  # guaranteed QoS, cgroupfs
    f"0::/kubepods.slice/kubepods-pod{UID.replace('-', '_')}.slice/cri-o-1.scope",  # guaranteed, systemd
])
def test_pod_uid_from_cgroup_lines(line: str) -> None:
    assert pod_uid("1:name=systemd:/user.slice\n" + line + "\n") == UID


def test_processes_outside_pods_are_not_attributed() -> None:
    assert pod_uid("0::/user.slice/user-1000.slice/session-3.scope\n") is None


class FakeNVML:
    def process_samples(self):
        return [ProcessSample(11, "GPU-a", 40, 1000), ProcessSample(12, "GPU-a", 70, 500),
                ProcessSample(13, "GPU-b", 5, 100)]


def test_serves_per_pod_json_and_metrics(tmp_path: Path) -> None:
    for pid, uid in ((11, UID), (12, UID), (13, None)):
        (tmp_path / str(pid)).mkdir()
        text = f"0::/kubepods/burstable/pod{uid}/c1\n" if uid else "0::/system.slice/sshd.service\n"
        (tmp_path / str(pid) / "cgroup").write_text(text)
    server = serve(0, FakeNVML(), tmp_path, host="127.0.0.1")
    threading.Thread(target=server.serve_forever, daemon=True).start()
    base = f"http://127.0.0.1:{server.server_port}"
    try:
        pods = json.load(urllib.request.urlopen(f"{base}/pods"))["pods"]
        metrics = urllib.request.urlopen(f"{base}/metrics").read().decode()
    finally:
        server.shutdown()
    assert pods == [{"uid": UID, "gpu_util_pct": 70.0, "memory_mib": 1500, "gpus": ["GPU-a"]}]
    assert f'gpupool_pod_gpu_memory_mib{{pod_uid="{UID}"}} 1500.0' in metrics
