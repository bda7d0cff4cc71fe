"""Free capacity of every node and GPU, and the only code that changes it.

The invariants live here: a GPU never holds more than 1000 milli, a fraction is
never split across GPUs, CPU/memory/pod counts never go below zero.
"""

from __future__ import annotations

from .errors import InvalidRequest
from .inventory import Inventory
from .request import Placement, Request
from .units import MILLI_PER_GPU


class ClusterState:
    def __init__(self, inventory: Inventory) -> None:
        self.inventory = inventory
        self.gpu_free: list[list[int]] = [[MILLI_PER_GPU] * len(n.gpus) for n in inventory.nodes]
        self.cpu_free: list[int] = [n.cpu_milli for n in inventory.nodes]
        self.mem_free: list[int] = [n.memory_mib for n in inventory.nodes]
        self.pods: list[int] = [0] * len(inventory.nodes)

    # --- queries -------------------------------------------------------------
    def node_fits(self, i: int, req: Request) -> bool:
        """CPU, memory, pod count, GPU model and GPU room all fit on node i."""
        node = self.inventory.nodes[i]
        if self.cpu_free[i] < req.cpu_milli or self.mem_free[i] < req.memory_mib:
            return False
        if self.pods[i] >= node.max_pods:
            return False
        if req.num_gpu == 0:
            return True
        if req.gpu_models and node.model not in req.gpu_models:
            return False
        free = self.gpu_free[i]
        if req.is_sharing:
            return any(f >= req.gpu_milli for f in free)
        return sum(1 for f in free if f == MILLI_PER_GPU) >= req.num_gpu

    def fitting_gpus(self, i: int, req: Request) -> list[int]:
        """GPU indices on node i that could take (a part of) the request."""
        need = req.gpu_milli if req.is_sharing else MILLI_PER_GPU
        return [g for g, f in enumerate(self.gpu_free[i]) if f >= need]

    def used_milli(self) -> int:
        return self.inventory.capacity_milli - sum(sum(f) for f in self.gpu_free)

    # --- changes -------------------------------------------------------------
    def apply(self, placement: Placement) -> None:
        i = self.inventory.index_of(placement.node)
        free = self.gpu_free[i]
        if len(set(placement.gpus)) != len(placement.gpus):
            raise InvalidRequest("a placement cannot use the same GPU twice")
        for g in placement.gpus:
            if not 0 <= g < len(free) or free[g] < placement.gpu_milli:
                raise InvalidRequest(f"GPU {g} on {placement.node} has no room for this placement")
        if self.cpu_free[i] < placement.cpu_milli or self.mem_free[i] < placement.memory_mib:
            raise InvalidRequest(f"{placement.node} has no CPU or memory left for this placement")
        for g in placement.gpus:
            free[g] -= placement.gpu_milli
        self.cpu_free[i] -= placement.cpu_milli
        self.mem_free[i] -= placement.memory_mib
        self.pods[i] += 1

    def release(self, placement: Placement) -> None:
        i = self.inventory.index_of(placement.node)
        free = self.gpu_free[i]
        for g in placement.gpus:
            if free[g] + placement.gpu_milli > MILLI_PER_GPU:
                raise InvalidRequest(f"GPU {g} on {placement.node} released more than it held")
        for g in placement.gpus:
            free[g] += placement.gpu_milli
        self.cpu_free[i] += placement.cpu_milli
        self.mem_free[i] += placement.memory_mib
        self.pods[i] -= 1

    def placement_on(self, i: int, req: Request, gpus: list[int]) -> Placement:
        return Placement(
            node=self.inventory.nodes[i].name,
            gpus=tuple(gpus),
            gpu_milli=req.gpu_milli if req.num_gpu else 0,
            cpu_milli=req.cpu_milli,
            memory_mib=req.memory_mib,
        )
