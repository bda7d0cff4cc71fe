"""Fixed build quotas through GPUKubeSpawner on the real kube-apiserver, as the chart's hub
account: kubespawner's own code creates the pods, the scheduler binds them to kwok GPU nodes.
A refused spawn creates nothing: the API server's audit log (plane.py) lists every pod create
anyone asked for, refused ones included, so "no pod" cannot be a pod that came and went.

The quota is the hub's (gpupool's pool, 0.5 GPU per user here); the binding is kube-scheduler's
`kai-scheduler` stand-in (plane.py). KAI-Scheduler's own binding of quarter-GPU workspaces, with a
quota refusal beside it, is in test_kai_real.py."""

from __future__ import annotations

import asyncio

import pytest
from tornado import web
from traitlets.config import Config

from tests.cluster.conftest import HUB_NS
from tests.cluster.plane import ControlPlane
from tests.cluster.resources import Resources
from tests.support.wait import until_async


async def start(sp) -> None:
    """kubespawner's start returns once its pod reflector saw the pod ready."""
    await asyncio.wait_for(sp.start(), 90)


def created(plane: ControlPlane, name: str) -> int:
    return plane.created("pods", HUB_NS).count(name)


async def test_the_spawn_past_the_quota_is_refused_and_creates_nothing(
    make_spawner, plane: ControlPlane, admin: Resources
) -> None:
    """Two workspaces of 0.25 GPU fill ann's build quota (0.5 GPU, at most 2 workspaces)."""
    a, b = make_spawner("ann", "a"), make_spawner("ann", "b")
    for sp in (a, b):
        await start(sp)
    c = make_spawner("ann", "c")
    with pytest.raises(web.HTTPError) as err:
        await c.start()
    assert err.value.status_code == 403
    assert err.value.jupyterhub_message == (
        "you may run 2 GPU workspace(s) at once and hold server 'a', server 'b': stop one first"
    )
    assert created(plane, c.pod_name) == 0  # never asked for
    assert admin.get(f"/api/v1/namespaces/{HUB_NS}/pods/{c.pod_name}") is None
    assert sorted(x.name for x in c.pool.store.allocations(owner="ann")) == ["a", "b"]
    # one stopped: a third of 0.5 GPU would still pass the GPU quota (0.25 + 0.5 > 0.5)
    await b.stop()
    big = make_spawner("ann", "c", options={"gpus": "0.5"})
    with pytest.raises(web.HTTPError) as err:
        await big.start()
    assert err.value.status_code == 403
    assert "quota" in err.value.jupyterhub_message and "0.5" in err.value.jupyterhub_message, (
        err.value.jupyterhub_message
    )
    assert created(plane, c.pod_name) == 0
    # another user's quota is their own; and within ann's, the same spawn at 0.25 runs
    bob = make_spawner("bob", "x", options={"gpus": "0.5"})
    await start(bob)
    await start(c)
    assert created(plane, c.pod_name) == 1
    for sp in (a, c, bob):
        await sp.stop()


async def test_over_quota_in_one_spawn_is_refused_before_any_pod_exists(
    make_spawner, plane: ControlPlane
) -> None:
    sp = make_spawner("cat", options={"gpus": "1"})  # quota 0.5
    with pytest.raises(web.HTTPError) as err:
        await sp.start()
    assert err.value.status_code in (400, 403)
    assert created(plane, sp.pod_name) == 0
    assert sp.pool.store.allocations() == []


async def test_a_hook_that_adds_gpus_is_caught_on_the_final_manifest(
    make_spawner, plane: ControlPlane
) -> None:
    def greedy_hook(spawner, pod):
        pod.spec.containers[0].resources.limits["nvidia.com/gpu"] = "1"
        return pod

    sp = make_spawner("dan", modify_pod_hook=greedy_hook)
    with pytest.raises(web.HTTPError) as err:
        await sp.start()
    assert (
        err.value.status_code == 403
        and "asks for 1.25 GPU but your quota allowed 0.25" in err.value.log_message
    )
    assert created(plane, sp.pod_name) == 0
    assert sp.pool.store.allocations() == []  # the reservation was released


PROFILES = [
    {"display_name": "CPU only", "slug": "cpu"},
    {"display_name": "Quarter GPU", "slug": "quarter", "gpupool": {"gpus": 0.25}, "default": True},
    {
        "display_name": "Staff GPU",
        "slug": "staff",
        "gpupool": {"gpus": 0.5, "groups": ["staff"]},
        "kubespawner_override": {"image": "registry.example.org/staff:1"},
    },
    {
        "display_name": "Broken",
        "slug": "broken",
        "gpupool": {"gpus": 0.25},
        "kubespawner_override": {"extra_resource_limits": {"nvidia.com/gpu": "2"}},
    },
]


async def test_profiles_offer_only_what_the_users_groups_and_quota_allow(
    make_spawner, plane: ControlPlane, admin: Resources
) -> None:
    student = make_spawner("eve", options={"profile": "staff"}, profile_list=PROFILES)
    form = await student.options_form(student)
    assert "Quarter GPU" in form and "Staff GPU" not in form
    with pytest.raises(web.HTTPError) as err:  # a tampered request for a profile not offered
        await student.start()
    assert err.value.status_code == 400 and "not offered to you" in err.value.jupyterhub_message
    assert created(plane, student.pod_name) == 0

    staff = make_spawner("fay", groups=("staff",), options={"profile": "staff"}, profile_list=PROFILES)
    await start(staff)
    pod = admin.get(f"/api/v1/namespaces/{HUB_NS}/pods/{staff.pod_name}")
    assert pod["metadata"]["annotations"]["gpu-fraction"] == "0.5"
    assert pod["spec"]["containers"][0]["image"] == "registry.example.org/staff:1"
    await staff.stop()


async def test_a_profile_that_asks_for_more_than_it_says_is_refused(
    make_spawner, plane: ControlPlane
) -> None:
    sp = make_spawner("gus", options={"profile": "broken"}, profile_list=PROFILES)
    with pytest.raises(web.HTTPError) as err:
        await sp.start()
    assert err.value.status_code == 403
    assert created(plane, sp.pod_name) == 0 and sp.pool.store.allocations() == []


async def test_a_cpu_profile_holds_no_gpu(make_spawner, admin: Resources) -> None:
    sp = make_spawner("hal", options={"profile": "cpu"}, profile_list=PROFILES)
    await start(sp)
    pod = admin.get(f"/api/v1/namespaces/{HUB_NS}/pods/{sp.pod_name}")
    assert "gpu-fraction" not in (pod["metadata"].get("annotations") or {})
    assert sp.pool.store.allocations() == []
    await sp.stop()


async def test_a_pod_that_dies_gives_its_share_back_on_poll(make_spawner, admin: Resources) -> None:
    sp = make_spawner("ida")
    await start(sp)
    # evicted, node lost, deleted by hand: gone without the hub asking
    admin.http.delete(
        f"/api/v1/namespaces/{HUB_NS}/pods/{sp.pod_name}", params={"gracePeriodSeconds": "0"}
    ).raise_for_status()
    await until_async(
        lambda: sp.pod_reflector.pods.get(f"{HUB_NS}/{sp.pod_name}") is None,
        "the reflector to see it gone",
        timeout=30,
    )
    assert await sp.poll() is not None
    assert sp.pool.store.allocations() == []


def pools_config(c: Config) -> None:
    c.TrainPool.node_pools = {"dgx": {"models": ["NVIDIA H100 80GB HBM3"]}, "ws": {"nodes": ["gpu-node-1"]}}
    c.GPUPool.default_build_quota = 1  # whole GPUs here
    c.GPUPool.build_pools = ["ws"]
    c.GPUPool.gpu_sharing = "whole"  # through the device plugin, kube-scheduler places the pod
    c.GPUPool.group_overrides = {"research": {"pools": ["dgx", "ws"]}}
    c.KubeSpawner.node_affinity_required = [
        {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]}
    ]


async def test_a_workspace_pod_gets_its_groups_node_pools_as_affinity(
    make_spawner, plane: ControlPlane, admin: Resources
) -> None:
    """Without KAI (whole GPUs through the device plugin; kube-scheduler places the pod): the
    nominal placement ignores pools (the hub's inventory on Kubernetes has none); the pod's node
    affinity keeps it on the user's pools, ANDed with what the profile asks, any of them with
    the first preferred, and the real scheduler places it accordingly. (On KAI a workspace goes
    to one pool, its shard: test_kai_real.py.)"""
    for node in ("gpu-node-0", "gpu-node-1"):  # the profile's own requirement: zone a
        admin.http.patch(
            f"/api/v1/nodes/{node}",
            json={"metadata": {"labels": {"zone": "a"}}},
            headers={"Content-Type": "application/merge-patch+json"},
        ).raise_for_status()
    sp = make_spawner(user="rex", groups=("research",), options={"gpus": "1"}, more=pools_config)
    await start(sp)
    pod = admin.get(f"/api/v1/namespaces/{HUB_NS}/pods/{sp.pod_name}")
    aff = pod["spec"]["affinity"]["nodeAffinity"]
    terms = aff["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    zone = {"key": "zone", "operator": "In", "values": ["a"]}
    assert terms == [
        {
            "matchExpressions": [
                zone,
                {"key": "nvidia.com/gpu.product", "operator": "In", "values": ["NVIDIA-H100-80GB-HBM3"]},
            ]
        },
        {
            "matchExpressions": [
                zone,
                {"key": "kubernetes.io/hostname", "operator": "In", "values": ["gpu-node-1"]},
            ]
        },
    ]
    assert [p["weight"] for p in aff["preferredDuringSchedulingIgnoredDuringExecution"]] == [100, 50]
    await sp.stop()
    one = make_spawner(
        user="rex", groups=("research",), options={"gpus": "1", "pool": "ws"}, more=pools_config
    )
    await start(one)
    pod = admin.get(f"/api/v1/namespaces/{HUB_NS}/pods/{one.pod_name}")
    terms = pod["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert [t["matchExpressions"][1]["key"] for t in terms["nodeSelectorTerms"]] == ["kubernetes.io/hostname"]
    assert pod["spec"]["nodeName"] == "gpu-node-1"  # the scheduler kept it on the pool's node
    await one.stop()
    other = make_spawner(user="ivy", options={"gpus": "1", "pool": "dgx"}, more=pools_config)
    with pytest.raises(web.HTTPError) as err:
        await other.start()
    assert (
        err.value.status_code == 403
        and "node pool 'dgx' is not one you may use" in err.value.jupyterhub_message
    )
    assert created(plane, other.pod_name) == 0 and other.pool.store.allocations(owner="ivy") == []
