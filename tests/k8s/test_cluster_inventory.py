"""The hub's GPUs from the cluster's nodes, without an API server: allocatable nvidia.com/gpu and
the GPU Operator's labels become the inventory build quotas count against (it was a constant 8
GPUs of 16 GiB in the z2jh overlay). The read through the real API server, as the hub's account,
is in tests/cluster/test_inventory_real.py."""

from __future__ import annotations

from gpupool.kube.inventory import inventory_from_nodes
from tests.cluster.resources import gpu_node


def test_nodes_allocatable_gpus_and_gpu_operator_labels_make_the_inventory() -> None:
    cpu = {"metadata": {"name": "cpu-0", "labels": {}}, "status": {"allocatable": {"cpu": "16"}}}
    a100 = gpu_node("a100-0", gpus=4, product="NVIDIA-A100-SXM4-40GB", memory_mib=40960)
    drained = gpu_node("h100-1", gpus=8)
    drained["status"]["allocatable"]["nvidia.com/gpu"] = "6"  # the device plugin offers what is healthy
    unlabelled = {"metadata": {"name": "old-0", "labels": {"nvidia.com/gpu.count": "2"}}, "status": {}}
    hostile = gpu_node("bad-0", gpus=1, memory_mib=0)
    hostile["metadata"]["labels"]["nvidia.com/gpu.memory"] = "-5"
    hostile["status"]["allocatable"]["nvidia.com/gpu"] = "100000"  # not a machine: no GPUs
    inv = inventory_from_nodes([drained, cpu, a100, unlabelled, hostile])
    assert [(n.name, len(n.gpus)) for n in inv.nodes] == [("a100-0", 4), ("h100-1", 6), ("old-0", 2)]
    assert inv.gpu_count == 12
    a = inv.node("a100-0").gpus[0]
    assert (a.model, a.memory_mib, a.virtual) == ("NVIDIA A100 SXM4 40GB", 40960, False)
    assert inv.node("h100-1").gpus[5].memory_mib == 81559
    assert inv.node("old-0").gpus[0].memory_mib == 0  # unknown: shares are asked for as fractions
