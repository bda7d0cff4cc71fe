"""GPUKubeSpawner's lifecycle against the fake API server: kubespawner's own code creates,
watches and deletes the pod through kubernetes_asyncio; the test plays the kubelet."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace

import pytest
from gpupool import runtime
from gpupool.spawner.form import requested_milli
from gpupool.spawner.kube import GPUKubeSpawner
from kubernetes_asyncio.config import kube_config
from tornado import web
from traitlets.config import Config

from tests.k8s.conftest import until
from tests.k8s.fake_apiserver import Cluster, FakeAPIServer

NS = "jhub"


def make_user(name: str, groups: list[str]) -> SimpleNamespace:
    return SimpleNamespace(name=name, id=7, url=f"/user/{name}/", escaped_name=name,
                           groups=[SimpleNamespace(name=g) for g in groups])


@pytest.fixture
async def make_spawner(kubeconfig: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, apiserver: FakeAPIServer):
    # kubespawner loads the kubeconfig; kubernetes_asyncio read $KUBECONFIG when it was imported
    monkeypatch.setattr(kube_config, "KUBE_CONFIG_DEFAULT_LOCATION", str(kubeconfig))
    runtime.reset()
    made: list[GPUKubeSpawner] = []

    def make(user: str = "ann", groups: tuple[str, ...] = ("students",), options: dict | None = None,
             more: Callable[[Config], None] | None = None, **settings) -> GPUKubeSpawner:
        c = Config()
        c.GPUPool.db_url = f"sqlite:///{tmp_path}/gpupool.sqlite"
        c.GPUPool.use_nvml = False
        c.GPUPool.virtual_gpus = 2
        c.GPUPool.virtual_gpu_memory_mib = 81920
        c.GPUPool.default_build_quota = 0.5
        c.GPUPool.allowed_fractions = [0.25, 0.5, 1]
        c.KubeSpawner.namespace = NS
        c.KubeSpawner.k8s_api_host = apiserver.url
        c.KubeSpawner.start_timeout = 10
        c.KubeSpawner.image = "quay.io/jupyter/base-notebook:2025-01-06"
        for key, value in settings.items():
            setattr(c.GPUKubeSpawner, key, value)
        if more is not None:  # other sections (GPUPool, TrainPool, KubeSpawner)
            more(c)
        hub = SimpleNamespace(public_host="", url="http://hub:8081/hub/", base_url="/hub/",
                              api_url="http://hub:8081/hub/api")
        sp = GPUKubeSpawner(user=make_user(user, list(groups)), hub=hub, config=c, name="")
        sp.api_token = "token"
        sp.user_options = options if options is not None else {"gpus": "0.25"}
        made.append(sp)
        return sp

    yield make
    for reflector in list(GPUKubeSpawner.reflectors.values()):
        await reflector.stop()
    GPUKubeSpawner.reflectors.clear()
    runtime.reset()


async def start_and_run(sp: GPUKubeSpawner, cluster: Cluster) -> dict:
    """Start the spawner; play the kubelet once the pod exists; return the pod as created."""
    task = asyncio.ensure_future(sp.start())
    pod = await until(lambda: cluster.api.get("api/v1", "pods", NS, sp.pod_name), what="the pod")
    cluster.run_pod(NS, sp.pod_name)
    await asyncio.wait_for(task, 10)
    return pod


def pod_posts(apiserver: FakeAPIServer) -> list:
    return [r for r in apiserver.requests() if r[0] == "POST" and r[1].endswith("/pods")]


async def test_start_creates_a_kai_pod_for_the_share_and_stop_deletes_it(make_spawner, cluster: Cluster,
                                                                         apiserver: FakeAPIServer) -> None:
    sp = make_spawner(kai_queue_groups=["students"])
    pod = await start_and_run(sp, cluster)
    # the pod as the API server received it (strictly validated there)
    assert pod["spec"]["schedulerName"] == "kai-scheduler"
    assert pod["spec"]["priorityClassName"] == "build"
    assert pod["metadata"]["labels"]["kai.scheduler/queue"] == "students"
    assert pod["metadata"]["annotations"]["gpu-fraction"] == "0.25"
    env = {e["name"]: e.get("value") for e in pod["spec"]["containers"][0]["env"]}
    assert env["GPUPOOL_GPU_FRACTION"] == "0.25"
    # the hub's nominal device index and its own paths would hide the pod's GPU / point nowhere
    assert not {"CUDA_VISIBLE_DEVICES", "PYTHONPATH", "GPUPOOL_GPU_UUIDS", "CUDA_MPS_PIPE_DIRECTORY"} & set(env)
    assert [a.total_milli for a in sp.pool.store.allocations(owner="ann")] == [250]
    assert await sp.poll() is None
    assert sp.pod_uid() == pod["metadata"]["uid"]  # what the culler asks the node agents about

    await sp.stop()
    assert apiserver.get("api/v1", "pods", NS, sp.pod_name) is None
    assert sp.pool.store.allocations(owner="ann") == []  # the share is back in the pool


async def test_the_workspace_queue_is_the_first_listed_group_the_user_is_in(make_spawner) -> None:
    listed = ["vision", "nlp"]  # the order of preference, not the alphabet
    assert make_spawner(groups=("admins", "nlp", "vision"), kai_queue_groups=listed).queue_name() == "vision"
    assert make_spawner(groups=("nlp", "admins"), kai_queue_groups=listed).queue_name() == "nlp"
    assert make_spawner(groups=("admins",), kai_queue_groups=listed).queue_name() == "default"  # no queue of its own


async def test_over_quota_is_refused_before_any_pod_exists(make_spawner, apiserver: FakeAPIServer) -> None:
    sp = make_spawner(options={"gpus": "1"})  # quota 0.5
    with pytest.raises(web.HTTPError) as err:
        await sp.start()
    assert err.value.status_code in (400, 403)
    assert pod_posts(apiserver) == []
    assert sp.pool.store.allocations() == []


async def test_a_hook_that_adds_gpus_is_caught_on_the_final_manifest(make_spawner, apiserver: FakeAPIServer) -> None:
    def greedy_hook(spawner, pod):
        pod.spec.containers[0].resources.limits["nvidia.com/gpu"] = "1"
        return pod

    sp = make_spawner(modify_pod_hook=greedy_hook)
    with pytest.raises(web.HTTPError) as err:
        await sp.start()
    assert err.value.status_code == 403 and "asks for 1.25 GPU but your quota allowed 0.25" in err.value.log_message
    assert pod_posts(apiserver) == []
    assert sp.pool.store.allocations() == []  # the reservation was released


PROFILES = [
    {"display_name": "CPU only", "slug": "cpu"},
    {"display_name": "Quarter GPU", "slug": "quarter", "gpupool": {"gpus": 0.25}, "default": True},
    {"display_name": "Staff GPU", "slug": "staff", "gpupool": {"gpus": 0.5, "groups": ["staff"]},
     "kubespawner_override": {"image": "registry.example.org/staff:1"}},
    {"display_name": "Broken", "slug": "broken", "gpupool": {"gpus": 0.25},
     "kubespawner_override": {"extra_resource_limits": {"nvidia.com/gpu": "2"}}},
]


async def test_profiles_offer_only_what_the_users_groups_and_quota_allow(make_spawner, cluster: Cluster,
                                                                         apiserver: FakeAPIServer) -> None:
    student = make_spawner(options={"profile": "staff"}, profile_list=PROFILES)
    form = await student.options_form(student)
    assert "Quarter GPU" in form and "Staff GPU" not in form
    with pytest.raises(web.HTTPError) as err:  # a tampered request for a profile not offered
        await student.start()
    assert err.value.status_code == 400 and "not offered to you" in err.value.jupyterhub_message
    assert pod_posts(apiserver) == []

    staff = make_spawner("bob", ("staff",), options={"profile": "staff"}, profile_list=PROFILES)
    pod = await start_and_run(staff, cluster)
    assert pod["metadata"]["annotations"]["gpu-fraction"] == "0.5"
    assert pod["spec"]["containers"][0]["image"] == "registry.example.org/staff:1"
    await staff.stop()


async def test_the_form_is_ours_without_profiles_kubespawners_with_them_and_the_admins_if_set(make_spawner) -> None:
    gpu = make_spawner()
    assert "0.25" in await gpu.get_options_form()
    assert requested_milli(gpu.run_options_from_form({"gpus": ["0.5"]})) == 500  # the form posts GPUs

    with_profiles = make_spawner(profile_list=PROFILES)
    assert "Quarter GPU" in await with_profiles.get_options_form()
    assert with_profiles.run_options_from_form({"profile": ["quarter"]}) == {"profile": "quarter"}

    admins = make_spawner(options_form="<p>our own form</p>")
    assert await admins.get_options_form() == "<p>our own form</p>"


async def test_a_profile_that_asks_for_more_than_it_says_is_refused(make_spawner, apiserver: FakeAPIServer) -> None:
    sp = make_spawner(options={"profile": "broken"}, profile_list=PROFILES)
    with pytest.raises(web.HTTPError) as err:
        await sp.start()
    assert err.value.status_code == 403
    assert pod_posts(apiserver) == [] and sp.pool.store.allocations() == []


async def test_a_cpu_profile_holds_no_gpu(make_spawner, cluster: Cluster) -> None:
    sp = make_spawner(options={"profile": "cpu"}, profile_list=PROFILES)
    pod = await start_and_run(sp, cluster)
    assert "gpu-fraction" not in (pod["metadata"].get("annotations") or {})
    assert sp.pool.store.allocations() == []
    await sp.stop()


async def test_a_pod_that_dies_gives_its_share_back_on_poll(make_spawner, cluster: Cluster) -> None:
    sp = make_spawner()
    await start_and_run(sp, cluster)
    cluster.api.remove("api/v1", "pods", NS, sp.pod_name)  # evicted, node lost, deleted by hand
    await until(lambda: sp.pod_reflector.pods.get(f"{NS}/{sp.pod_name}") is None, what="the reflector")
    assert await sp.poll() is not None
    assert sp.pool.store.allocations() == []


def pools_config(c: Config) -> None:
    c.TrainPool.node_pools = {"dgx": {"models": ["NVIDIA H100 80GB HBM3"]}, "ws": {"nodes": ["ws-1"]}}
    c.GPUPool.build_pools = ["ws"]
    c.GPUPool.group_overrides = {"research": {"pools": ["dgx", "ws"]}}
    c.KubeSpawner.node_affinity_required = [{"matchExpressions": [{"key": "zone", "operator": "In",
                                                                    "values": ["a"]}]}]


async def test_a_workspace_pod_gets_its_groups_node_pools_as_affinity(make_spawner, cluster: Cluster,
                                                                       apiserver: FakeAPIServer) -> None:
    """The nominal placement ignores pools (the hub's inventory on Kubernetes has none); the
    pod's node affinity keeps it on the user's pools, ANDed with what the profile asks."""
    sp = make_spawner(user="rex", groups=("research",), more=pools_config)
    pod = await start_and_run(sp, cluster)
    aff = pod["spec"]["affinity"]["nodeAffinity"]
    terms = aff["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    zone = {"key": "zone", "operator": "In", "values": ["a"]}
    assert terms == [
        {"matchExpressions": [zone, {"key": "nvidia.com/gpu.product", "operator": "In",
                                     "values": ["NVIDIA-H100-80GB-HBM3"]}]},
        {"matchExpressions": [zone, {"key": "kubernetes.io/hostname", "operator": "In", "values": ["ws-1"]}]}]
    assert [p["weight"] for p in aff["preferredDuringSchedulingIgnoredDuringExecution"]] == [100, 50]
    await sp.stop()
    one = make_spawner(user="rex", groups=("research",), options={"gpus": "0.25", "pool": "ws"}, more=pools_config)
    pod = await start_and_run(one, cluster)
    terms = pod["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert [t["matchExpressions"][1]["key"] for t in terms["nodeSelectorTerms"]] == ["kubernetes.io/hostname"]
    await one.stop()
    other = make_spawner(user="ann", options={"gpus": "0.25", "pool": "dgx"}, more=pools_config)
    with pytest.raises(web.HTTPError) as err:
        await other.start()
    assert err.value.status_code == 403 and "node pool 'dgx' is not one you may use" in err.value.jupyterhub_message
    assert len(pod_posts(apiserver)) == 2 and other.pool.store.allocations(owner="ann") == []
