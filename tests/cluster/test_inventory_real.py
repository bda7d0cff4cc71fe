"""One inventory: the hub reads its GPUs from the real API server as the chart's hub account
(the chart's ClusterRole lets it list nodes), from kwok nodes labelled as the GPU Operator labels
them. Build quotas count these GPUs, a quarter GPU by memory is a quarter of the real card, and
the spawn form no longer calls the GPUs virtual (the z2jh overlay declared 8 virtual GPUs of
16 GiB before)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest

from gpupool.gpu.memory_cap import DEFAULT_CONTEXT_MIB, share_cap_mib
from gpupool.kube.inventory import inventory_from_nodes
from tests.cluster.conftest import HUB_NS
from tests.cluster.resources import Resources, gpu_node

A100 = "inv-a100-0"


@pytest.fixture
def a100_node(admin: Resources) -> Iterator[str]:
    """A second kind of GPU node; tainted so that no other test's pod lands on it."""
    node = gpu_node(A100, gpus=4, product="NVIDIA-A100-SXM4-40GB", memory_mib=40960)
    node["spec"]["taints"] = [{"key": "gpupool.test/inventory-only", "effect": "NoSchedule"}]
    admin.apply(node)
    try:
        yield A100
    finally:
        admin.http.delete(f"/api/v1/nodes/{A100}")


async def test_the_hub_counts_the_clusters_gpus_and_a_share_gets_the_real_cards_memory(
    a100_node: str, make_spawner, admin: Resources
) -> None:
    sp = make_spawner(
        "ann",
        server="inv",
        fraction_by_memory=True,
        more=lambda c: setattr(c.GPUPool, "gpu_inventory", "kubernetes"),
    )
    inv = sp.pool.inventory  # read as the hub's account when the pool is built
    assert inv == inventory_from_nodes(admin.get("/api/v1/nodes")["items"])
    a100, h100 = inv.node(A100), inv.node("gpu-node-0")
    assert [(len(n.gpus), n.model, n.gpus[0].memory_mib) for n in (a100, h100)] == [
        (4, "NVIDIA A100 SXM4 40GB", 40960),
        (8, "NVIDIA H100 80GB HBM3", 81559),
    ]
    assert not any(g.virtual for n in inv.nodes for g in n.gpus)
    assert "These GPUs are virtual" not in sp.render_gpu_form()
    await asyncio.wait_for(sp.start(), 90)
    try:
        pod = admin.get(f"/api/v1/namespaces/{HUB_NS}/pods/{sp.pod_name}")
        memory = inv.node(sp.gpupool_allocation.node).gpus[0].memory_mib
        env = {e["name"]: e.get("value") for e in pod["spec"]["containers"][0]["env"]}
        # KAI reserves a quarter of the card the hub counted (was a quarter of the overlay's
        # 16 GiB: 4096); the process's cap inside it leaves room for its CUDA context
        assert pod["metadata"]["annotations"]["gpu-memory"] == str(memory // 4)
        assert env["GPUPOOL_GPU_MEMORY_MIB"] == str(
            share_cap_mib(250, memory, context_mib=DEFAULT_CONTEXT_MIB)
        )
        assert int(env["GPUPOOL_GPU_MEMORY_MIB"]) == memory // 4 - DEFAULT_CONTEXT_MIB
    finally:
        await sp.stop()
