"""The real control plane, once per test session (see plane.py for what runs and what stands in).

Tests here are marked `cluster`. Without Go they skip with the reason, except in CI (CI=true),
where they fail; with Go, a control plane that does not start fails them everywhere."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.cluster import build
from tests.cluster.plane import ControlPlane, env_flag
from tests.cluster.resources import Resources, gpu_node, until

GPU_NODES = 2  # kwok nodes, 8 GPUs each


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    for item in items:
        if here in Path(str(item.fspath)).parents:
            item.add_marker(pytest.mark.cluster)


@pytest.fixture(scope="session")
def plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    if not shutil.which("go"):
        if env_flag("CI"):
            pytest.fail("Go is missing in CI: the cluster tests build their control plane with it")
        pytest.skip("Go is not installed: the cluster tests build kube-apiserver, etcd and kwok with it")
    bins = build.binaries(log=lambda line: print(line, flush=True))
    cp = ControlPlane(tmp_path_factory.mktemp("plane"), bins)
    try:
        cp.start()
    except RuntimeError:
        cp.stop()
        raise
    try:
        with cp.client() as http:
            res = Resources(http)
            for i in range(GPU_NODES):
                res.apply(gpu_node(f"gpu-node-{i}"))
            until(lambda: all(
                any(c["type"] == "Ready" and c["status"] == "True"
                    for c in (res.get(f"/api/v1/nodes/gpu-node-{i}") or {}).get("status", {}).get("conditions", []))
                for i in range(GPU_NODES)), 60, "kwok nodes Ready")
        yield cp
    finally:
        cp.stop()


@pytest.fixture
def admin(plane: ControlPlane) -> Iterator[Resources]:
    with plane.client() as http:
        yield Resources(http)


# --- the chart, applied as a cluster admin would ------------------------------------------
HUB_NS = "jhub"
CHART_VALUES = {"hub": {"namespace": HUB_NS, "serviceAccountName": "hub"}, "priorityClasses": {"create": True},
                "userNamespaces": {"enabled": True, "users": ["ann", "bob"]}}


@pytest.fixture(scope="session")
def chart(plane: ControlPlane) -> list[dict]:
    """KAI's CRDs (from the shared schemas: KAI's module is not in the proxy), the namespace
    and service account z2jh would make for its hub, then every object the chart renders."""
    import yaml

    from tests.k8s.conftest import SCHEMAS
    from tests.k8s.test_chart import render

    if not SCHEMAS.exists():
        if env_flag("CI"):
            pytest.fail(f"KAI's CRDs are read from {SCHEMAS}, which is missing")
        pytest.skip(f"KAI's CRDs are read from {SCHEMAS}, which is missing (GPUPOOL_SHARED_DIR)")
    docs = render(CHART_VALUES)
    crds = [yaml.safe_load(f.read_text()) for f in sorted((SCHEMAS / "crds").glob("scheduling.run.ai_*.yaml"))]
    z2jh = [{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": HUB_NS}},
            {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "gpupool"}},  # helm --create-namespace
            {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "hub", "namespace": HUB_NS}},
            # z2jh's own hub Role (its chart renders these rules): workspace pods in its namespace
            {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role", "metadata": {"name": "hub", "namespace": HUB_NS},
             "rules": [{"apiGroups": [""], "resources": ["pods", "persistentvolumeclaims", "secrets", "services"],
                        "verbs": ["get", "watch", "list", "create", "delete"]},
                       {"apiGroups": [""], "resources": ["events"], "verbs": ["get", "watch", "list"]}]},
            {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
             "metadata": {"name": "hub", "namespace": HUB_NS},
             "subjects": [{"kind": "ServiceAccount", "name": "hub", "namespace": HUB_NS}],
             "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "hub"}}]
    with plane.client() as http:
        Resources(http).apply_all(crds + z2jh + docs)
    return docs
