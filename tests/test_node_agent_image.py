"""The node agent's small image (helm/node-agent-image) holds gpupool without its dependencies and
only the requirements its Dockerfile names: the agent must run on those alone. A real agent
process is started where any other import fails, as it would in the image (the real node runs the
image itself: tests/cluster/test_node_real.py's culler tests)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import tomllib
from importlib.metadata import packages_distributions
from pathlib import Path

import httpx
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from tests.cluster.plane import free_port
from tests.support.wait import until

REPO = Path(__file__).resolve().parents[1]
DOCKERFILE = REPO / "helm" / "node-agent-image" / "Dockerfile"

# Runs the agent as the image's ENTRYPOINT does, after refusing every top-level module but the
# standard library's and those allowed (what the image installs): an import outside them fails as
# it would in the image, where the module is not there.
BLOCKED_AGENT = """
import json, os, runpy, sys
allowed = set(json.loads(os.environ["AGENT_ALLOWED"])) | set(sys.stdlib_module_names)
class NotInImage:
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] not in allowed:
            raise ModuleNotFoundError(f"{name} is not in the node agent's image", name=name)
        return None
sys.meta_path.insert(0, NotInImage())
sys.argv = ["node_agent", *sys.argv[1:]]
runpy.run_module(os.environ.get("AGENT_MODULE", "gpupool.idle_culler.node_agent"), run_name="__main__", alter_sys=True)
"""


def image_requirements() -> list[Requirement]:
    """The requirements the Dockerfile's `pip install` lines name (not gpupool's wheel)."""
    text = DOCKERFILE.read_text()
    found = [
        Requirement(words)
        for line in re.findall(r"pip install[^\n]*", text)
        for words in re.findall(r'"([^"$]+)"', line)
    ]
    assert found, "no requirement found in the node agent's Dockerfile"
    return found


def test_the_image_requirements_are_pyprojects_own() -> None:
    """The image pins what gpupool's package pins: a bump in pyproject.toml that the image missed
    would give the agent a version the package was never tested with."""
    deps = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    declared = {canonicalize_name(r.name): r.specifier for r in map(Requirement, deps)}
    for req in image_requirements():
        assert canonicalize_name(req.name) in declared, f"{req.name}: not a gpupool dependency"
        assert req.specifier == declared[canonicalize_name(req.name)], req.name


def image_modules() -> list[str]:
    """The top-level modules the image has beyond the standard library."""
    dists = {canonicalize_name(r.name) for r in image_requirements()}
    return ["gpupool"] + sorted(
        module
        for module, names in packages_distributions().items()
        if any(canonicalize_name(n) in dists for n in names)
    )


def test_the_charts_uninstall_step_runs_with_only_what_the_image_installs() -> None:
    """The chart's pre-delete hook runs `python -m gpupool.kube.usage_finalizer` in this image:
    it imports and reaches its own check of what it was given (here nothing: it says so and
    exits 1) without the hub's dependencies (its I/O runs for real on the real node)."""
    proc = subprocess.run(
        [sys.executable, "-c", BLOCKED_AGENT],
        env={
            "AGENT_ALLOWED": json.dumps(image_modules()),
            "AGENT_MODULE": "gpupool.kube.usage_finalizer",
            "GPUPOOL_NAMESPACES": "",
            "PATH": "/usr/bin:/bin",
        },
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 1 and proc.stdout.strip() == (
        'FAIL: GPUPOOL_NAMESPACES names no namespace (a list, or "*" for all)'
    ), proc.stdout + proc.stderr


def test_the_agent_serves_with_only_what_its_image_installs() -> None:
    """The agent starts and answers /pods and /metrics importing only the standard library,
    gpupool and its image's requirements: no numpy, JupyterHub or anything the hub pulls in."""
    allowed = image_modules()
    assert "pynvml" in allowed and "prometheus_client" in allowed
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-c", BLOCKED_AGENT, "--no-token", "--virtual-gpus", "1", "--host", "127.0.0.1"]
        + ["--port", str(port), "--interval", "60"],
        env={"AGENT_ALLOWED": json.dumps(allowed), "PATH": "/usr/bin:/bin"},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:

        def pods() -> httpx.Response | None:
            if proc.poll() is not None:
                raise AssertionError(f"the agent exited {proc.returncode}:\n{proc.stdout.read()}")  # type: ignore[union-attr]
            try:
                return httpx.get(f"http://127.0.0.1:{port}/pods", timeout=2)
            except httpx.TransportError:
                return None

        answer = until(pods, "the agent to answer /pods", timeout=30)
        assert answer.status_code == 200, answer.text
        assert [g["uuid"] for g in answer.json()["gpus"]] == ["GPU-virtual-0"]
        metrics = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5)
        assert (
            metrics.status_code == 200 and 'gpupool_gpu_utilization_pct{gpu="GPU-virtual-0"}' in metrics.text
        )
    finally:
        proc.terminate()
        proc.wait(timeout=10)
