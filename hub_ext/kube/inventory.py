"""The hub's GPU inventory from the cluster: each node's allocatable `nvidia.com/gpu` (what the
device plugin offers) and the GPU Operator's labels (GPU feature discovery: `nvidia.com/gpu.product`,
`nvidia.com/gpu.memory` in MiB, `nvidia.com/gpu.count`), never a constant. Build quotas count
against these GPUs, and a fraction's memory (KAI's `gpu-memory`, GPUPOOL_GPU_MEMORY_MIB) is the
real card's. Read once when the hub starts: restart the hub after adding GPU nodes.

The inventory stays nominal (gpupool.spawner.kube): KAI picks the device a pod gets."""

from __future__ import annotations

import asyncio
import os
from concurrent.futures import ThreadPoolExecutor

from gpupool.kube.shapes import KubeNode
from gpupool.pool import Inventory, Node
from gpupool.pool.inventory import GPU

GPU_RESOURCE = "nvidia.com/gpu"
PRODUCT = "nvidia.com/gpu.product"
MEMORY = "nvidia.com/gpu.memory"
COUNT = "nvidia.com/gpu.count"
MAX_GPUS_PER_NODE = 64  # more is a wrong label, not a machine
MAX_MEMORY_MIB = 1 << 24  # 16 TiB


def _bounded(text: object, top: int) -> int:
    """A non-negative integer from a label or quantity, 0 when it is not one or out of bounds."""
    try:
        value = int(str(text).strip())
    except (TypeError, ValueError):
        return 0
    return value if 0 <= value <= top else 0


def gpu_count(node: KubeNode) -> int:
    """The node's GPUs: allocatable nvidia.com/gpu, else the GPU Operator's count label."""
    alloc = ((node.get("status") or {}).get("allocatable") or {}).get(GPU_RESOURCE)
    if alloc is not None:
        return _bounded(alloc, MAX_GPUS_PER_NODE)
    return _bounded(((node.get("metadata") or {}).get("labels") or {}).get(COUNT), MAX_GPUS_PER_NODE)


def inventory_from_nodes(nodes: list[KubeNode]) -> Inventory:
    """The nodes with GPUs, by name; a GPU's model is GFD's product label with spaces back
    ("NVIDIA-H100-80GB-HBM3" -> "NVIDIA H100 80GB HBM3"), its memory the memory label (0 when
    unlabelled: a share is then asked for as a fraction, never as memory)."""
    out = []
    for node in sorted(nodes, key=lambda n: n["metadata"]["name"]):
        name = node["metadata"]["name"]
        count = gpu_count(node)
        if not count:
            continue
        labels = node["metadata"].get("labels") or {}
        model = " ".join(str(labels.get(PRODUCT) or "NVIDIA GPU").split("-"))[:100]
        memory = _bounded(labels.get(MEMORY), MAX_MEMORY_MIB)
        gpus = tuple(
            GPU(index=i, uuid=f"{name}/gpu-{i}", model=model, memory_mib=memory) for i in range(count)
        )
        out.append(Node(name=name, gpus=gpus))
    return Inventory(nodes=tuple(out))


async def _read_nodes(timeout_s: float) -> list[KubeNode]:
    from kubernetes_asyncio import client, config

    cfg = client.Configuration()
    if os.environ.get("KUBERNETES_SERVICE_HOST"):  # in a pod: its service account
        config.load_incluster_config(client_configuration=cfg)
    else:
        await config.load_kube_config(client_configuration=cfg)
    async with client.ApiClient(cfg) as api:
        nodes = await client.CoreV1Api(api).list_node(_request_timeout=timeout_s)
        return api.sanitize_for_serialization(nodes).get("items") or []


def cluster_inventory(timeout_s: float = 30.0) -> Inventory:
    """The cluster's GPUs, read now (the hub builds its pool synchronously, maybe inside its
    event loop: the read runs on a thread with a loop of its own). A failed read raises: a hub
    that counted no GPUs would refuse every spawn and drop every share it holds."""
    with ThreadPoolExecutor(1, thread_name_prefix="gpupool-inventory") as ex:
        nodes = ex.submit(asyncio.run, _read_nodes(timeout_s)).result(timeout_s + 5)
    return inventory_from_nodes(nodes)
