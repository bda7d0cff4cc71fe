"""The node agent answers only the hub's culler: the chart's Secret holds one token for the
agents' namespace and the hub's, the DaemonSet mounts it, the culler's sampler sends it.

Real: the chart's objects as the API server admitted them (tests/cluster/conftest.py applies
every rendered object), the token read back from the admitted Secret, and a node agent started
as its DaemonSet starts it (`python -m gpupool.idle_culler.node_agent --token-file ...`) in a
local process. No GPU here: that process has no NVML, so an authorized request gets its 503
"NVML ..." answer; the culler's data path with a token is shown on an in-process agent whose
NVML sees no GPU process (test_spawner_real.py)."""

from __future__ import annotations

import base64
import subprocess
import sys
import threading
from pathlib import Path

import httpx
import pytest

from gpupool.idle_culler.node_agent.server import Agent, file_token, serve
from gpupool.idle_culler.sampler import NodeAgentSampler, Target
from tests.cluster.conftest import HUB_NS
from tests.cluster.plane import free_port
from tests.cluster.resources import Resources
from tests.support.wait import until

AGENT_NS = "gpupool"  # the release's namespace in conftest.CHART_VALUES
SECRET = "gpupool-node-agent-token"


def admitted_token(admin: Resources, namespace: str) -> str:
    secret = admin.get(f"/api/v1/namespaces/{namespace}/secrets/{SECRET}")
    assert secret is not None, f"no {SECRET} in {namespace}"
    return base64.b64decode(secret["data"]["token"]).decode()


def test_the_agents_and_the_hub_get_one_token_and_the_daemonset_requires_it(chart, admin: Resources) -> None:
    token = admitted_token(admin, AGENT_NS)
    assert len(token) >= 32 and admitted_token(admin, HUB_NS) == token
    ds = admin.get(f"/apis/apps/v1/namespaces/{AGENT_NS}/daemonsets/gpupool-node-agent")
    pod = ds["spec"]["template"]["spec"]
    container = pod["containers"][0]
    mount = next(m for m in container["volumeMounts"] if m["name"] == "token")
    volume = next(v for v in pod["volumes"] if v["name"] == "token")
    assert volume["secret"]["secretName"] == SECRET and mount["readOnly"]
    cmd = container["command"]
    assert cmd[cmd.index("--token-file") + 1] == f"{mount['mountPath']}/token"
    sa = admin.get(f"/api/v1/namespaces/{AGENT_NS}/serviceaccounts/{pod['serviceAccountName']}")
    assert sa["automountServiceAccountToken"] is False  # a shared token: it still never reads the API


@pytest.fixture
def agent_process(chart, admin: Resources, tmp_path: Path):
    """The agent as its DaemonSet runs it, its token file holding what the Secret holds."""
    token_file = tmp_path / "token"
    token_file.write_text(admitted_token(admin, AGENT_NS))
    port = free_port()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "gpupool.idle_culler.node_agent",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--interval",
            "1",
            "--proc",
            str(tmp_path),
            "--token-file",
            str(token_file),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"

    def answers() -> bool:
        try:
            httpx.get(f"{url}/healthz", timeout=1)
            return True
        except httpx.TransportError:
            assert proc.poll() is None, proc.stdout.read().decode()[-2000:]  # it died: its output
            return False

    until(answers, "the node agent to answer", timeout=30)
    yield url, token_file.read_text()
    proc.terminate()
    proc.wait(10)


def test_a_real_agent_refuses_requests_without_the_token(agent_process) -> None:
    url, token = agent_process
    for path in ("/pods", "/metrics"):
        r = httpx.get(url + path)
        assert r.status_code == 401 and r.headers["WWW-Authenticate"].startswith("Bearer")
        assert (
            httpx.get(url + path, headers={"Authorization": "Bearer " + "x" * len(token)}).status_code == 403
        )
        assert httpx.get(url + path, headers={"Authorization": f"Basic {token}"}).status_code == 401
    # with the token it answers what it knows: here, that NVML is missing (no GPU on this machine)
    r = httpx.get(url + "/pods", headers={"Authorization": f"Bearer {token}"})
    assert r.status_code == 503 and "NVML" in r.json()["error"]
    assert httpx.get(url + "/healthz").status_code == 503  # the kubelet's probe needs no token


def test_an_agent_started_without_a_token_refuses_to_start() -> None:
    r = subprocess.run(
        [sys.executable, "-m", "gpupool.idle_culler.node_agent", "--port", "0"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert r.returncode == 2 and "--token-file is required" in r.stderr


class NoGPUProcesses:
    def process_samples(self) -> list:
        return []

    def device_samples(self) -> list:
        return []


def test_the_culler_sends_the_token_and_without_it_gets_no_data(
    chart, admin: Resources, tmp_path: Path
) -> None:
    uid = "6f1c9a2e-3b4d-4e5f-8a9b-0c1d2e3f4a5b"
    proc = tmp_path / "proc" / "4242"
    proc.mkdir(parents=True)
    (proc / "cgroup").write_text(
        f"0::/kubepods.slice/kubepods-pod{uid.replace('-', '_')}.slice/cri-1.scope\n"
    )
    token_file = tmp_path / "token"  # as the hub pod mounts the Secret of its own namespace
    token_file.write_text(admitted_token(admin, HUB_NS))
    agent = Agent(NoGPUProcesses(), tmp_path / "proc")
    agent.refresh()
    server = serve(agent, 0, host="127.0.0.1", token=file_token(token_file))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = [f"http://agents.test:{server.server_address[1]}/pods"]
        target = [Target("ann", "", pod_uid=uid)]
        with_token = NodeAgentSampler(url, resolve=lambda _h, _p: ["127.0.0.1"], token_file=str(token_file))
        use = with_token.sample(target)["ann/"]
        assert (use.util_pct, use.memory_mib) == (0.0, 0)  # idle, never opened CUDA
        without = NodeAgentSampler(url, resolve=lambda _h, _p: ["127.0.0.1"])
        assert without.sample(target) == {}  # 401: no data, so no GPU rule culls on it
    finally:
        server.shutdown()
        server.server_close()
