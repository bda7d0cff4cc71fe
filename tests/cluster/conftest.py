"""The real control plane, once per test session (see plane.py for what runs and what stands in).

Tests here are marked `cluster`. Without Go they skip with the reason, except in CI (CI=true),
where they fail; with Go, a control plane that does not start fails them everywhere."""

from __future__ import annotations

import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from types import SimpleNamespace

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
    # The cluster's tests after all others: the control plane (etcd, kube-apiserver, KAI, kwok...)
    # runs from the first of them to the end of the session, and idling beside the hub tests it
    # slowed them by half on two cores (the class-size culler test: 47 s alone, 74 s beside it).
    # The real node's tests last: they install gpupool's chart with helm over what the `chart`
    # fixture applied, and their node must not take the kwok tests' pods.
    items.sort(
        key=lambda item: (
            item.get_closest_marker("cluster") is not None,
            item.get_closest_marker("node") is not None,
        )
    )


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
            until(
                lambda: all(
                    any(
                        c["type"] == "Ready" and c["status"] == "True"
                        for c in (res.get(f"/api/v1/nodes/gpu-node-{i}") or {})
                        .get("status", {})
                        .get("conditions", [])
                    )
                    for i in range(GPU_NODES)
                ),
                60,
                "kwok nodes Ready",
            )
        yield cp
    finally:
        cp.stop()


@pytest.fixture
def admin(plane: ControlPlane) -> Iterator[Resources]:
    with plane.client() as http:
        yield Resources(http)


# --- the chart, applied as a cluster admin would ------------------------------------------
HUB_NS = "jhub"
CHART_VALUES = {
    "hub": {"namespace": HUB_NS, "serviceAccountName": "hub"},
    "priorityClasses": {"create": True},
    "userNamespaces": {"enabled": True, "users": ["ann", "bob"]},
}


@pytest.fixture(scope="session")
def chart(plane: ControlPlane) -> list[dict]:
    """KAI's CRDs (from KAI-Scheduler's module at the version tests/cluster/go/kai pins, as its
    chart installs them), the namespace and service account z2jh would make for its hub, then
    every object the chart renders."""
    from tests.cluster import kai
    from tests.k8s.test_chart import render

    try:
        crds = kai.crds()
    except RuntimeError as err:
        if env_flag("CI"):
            pytest.fail(f"KAI-Scheduler's CRDs could not be read from its module: {err}")
        pytest.skip(f"KAI-Scheduler's CRDs could not be read from its module: {err}")
    docs = render(CHART_VALUES)
    z2jh = [
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": HUB_NS}},
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "gpupool"}},  # helm --create-namespace
        # KAI's chart makes its namespace (installed first): gpupool's chart grants the hub a read there
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "kai-scheduler"}},
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "hub", "namespace": HUB_NS}},
        # z2jh's own hub Role (its chart renders these rules): workspace pods in its namespace
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "Role",
            "metadata": {"name": "hub", "namespace": HUB_NS},
            "rules": [
                {
                    "apiGroups": [""],
                    "resources": ["pods", "persistentvolumeclaims", "secrets", "services"],
                    "verbs": ["get", "watch", "list", "create", "delete"],
                },
                {"apiGroups": [""], "resources": ["events"], "verbs": ["get", "watch", "list"]},
            ],
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": {"name": "hub", "namespace": HUB_NS},
            "subjects": [{"kind": "ServiceAccount", "name": "hub", "namespace": HUB_NS}],
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "hub"},
        },
    ]
    with plane.client() as http:
        Resources(http).apply_all(crds + z2jh + docs)
    return docs


# --- workspaces spawned by GPUKubeSpawner as the chart's hub account -----------------------
def make_user(
    name: str, groups: tuple[str, ...] = ("students",), settings: dict | None = None
) -> SimpleNamespace:
    """A hub User as a spawner sees it; `settings`: the hub's tornado settings (JupyterHub's
    `User.settings`, where gpupool's composition root is)."""
    return SimpleNamespace(
        name=name,
        id=7,
        url=f"/user/{name}/",
        escaped_name=name,
        groups=[SimpleNamespace(name=g) for g in groups],
        settings=settings or {},
    )


@pytest.fixture
async def make_spawner(
    plane: ControlPlane, chart: list[dict], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Callable[..., object]]:
    """GPUKubeSpawners sharing one pool (quota 0.5 GPU per user, two 80 GB GPUs declared), whose
    kubespawner calls the API server with a TokenRequest token of the chart's hub account."""
    from jupyterhub import orm
    from kubernetes_asyncio.config import kube_config
    from kubespawner import clients
    from traitlets.config import Config

    from gpupool.spawner.kube import GPUKubeSpawner
    from gpupool.wiring.root import ROOT_KEY, GPUPoolHub

    kubeconfig = plane.sa_kubeconfig(tmp_path / "hub.kubeconfig", HUB_NS, "hub")
    monkeypatch.setattr(kube_config, "KUBE_CONFIG_DEFAULT_LOCATION", str(kubeconfig))
    clients.load_config.cache_clear()  # kubespawner loads the kubeconfig once per process
    made: list[GPUKubeSpawner] = []
    roots: list[GPUPoolHub] = []  # one hub: built from the first spawner's config, as a hub does once

    def make(
        user: str = "ann",
        server: str = "",
        options: dict | None = None,
        groups: tuple[str, ...] = ("students",),
        more: Callable[[Config], None] | None = None,
        **settings,
    ) -> GPUKubeSpawner:
        c = Config()
        c.GPUPool.db_url = f"sqlite:///{tmp_path}/gpupool.sqlite"
        c.GPUPool.use_nvml = False
        c.GPUPool.virtual_gpus = 2
        c.GPUPool.virtual_gpu_memory_mib = 81559
        c.GPUPool.default_build_quota = 0.5
        c.GPUPool.allowed_fractions = [0.25, 0.5, 1]
        c.GPUPool.mps_pipe_directory = "/tmp/nvidia-mps"  # the hub's, never a pod's
        c.KubeSpawner.namespace = HUB_NS
        c.KubeSpawner.k8s_api_host = plane.url
        c.KubeSpawner.k8s_api_ssl_ca_cert = str(plane.certs.ca)
        c.KubeSpawner.start_timeout = 60
        c.KubeSpawner.image = "quay.io/jupyter/base-notebook:2025-01-06"
        c.GPUKubeSpawner.kai_queue = "default"
        for key, value in settings.items():
            setattr(c.GPUKubeSpawner, key, value)
        if more is not None:  # other sections (GPUPool, TrainPool, KubeSpawner)
            more(c)
        hub = SimpleNamespace(
            public_host="", url="http://hub:8081/hub/", base_url="/hub/", api_url="http://hub:8081/hub/api"
        )
        if not roots:
            roots.append(GPUPoolHub(c))
        # a named server's name lives on its ORM row (JupyterHub's own class, not in a database)
        sp = GPUKubeSpawner(
            user=make_user(user, groups, {ROOT_KEY: roots[0]}),
            hub=hub,
            config=c,
            orm_spawner=orm.Spawner(name=server),
        )
        sp.api_token = "token"
        sp.user_options = options if options is not None else {"gpus": "0.25"}
        made.append(sp)
        return sp

    yield make
    with plane.client() as http:  # what a test left running
        for sp in made:
            http.delete(f"/api/v1/namespaces/{HUB_NS}/pods/{sp.pod_name}", params={"gracePeriodSeconds": "0"})
    for reflector in list(GPUKubeSpawner.reflectors.values()):
        await reflector.stop()
    GPUKubeSpawner.reflectors.clear()
    for root in roots:
        root.close()
