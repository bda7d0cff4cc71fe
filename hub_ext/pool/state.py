"""Free capacity of every node and GPU, and the only code that changes it.

The invariants live here: a GPU never holds more than 1000 milli, a fraction is
never split across GPUs, CPU/memory/pod counts never go below zero.

Arrays (numpy) so that policies can score every node at once: the simulator replays
ten thousand placements on a 1,213-node cluster through this same code. GPU slots a
node does not have hold -1 and never fit anything.
"""

from __future__ import annotations

import numpy as np

from gpupool.pool.errors import InvalidRequest
from gpupool.pool.inventory import Inventory
from gpupool.pool.request import Placement, Request
from gpupool.pool.units import MILLI_PER_GPU

ABSENT = -1


class ClusterState:
    def __init__(self, inventory: Inventory) -> None:
        self.inventory = inventory
        nodes = inventory.nodes
        width = max((len(n.gpus) for n in nodes), default=0) or 1
        self.gpu_free = np.full((len(nodes), width), ABSENT, dtype=np.int64)
        for i, n in enumerate(nodes):
            self.gpu_free[i, : len(n.gpus)] = MILLI_PER_GPU
        self.gpu_count = np.array([len(n.gpus) for n in nodes], dtype=np.int64)
        self.cpu_free = np.array([n.cpu_milli for n in nodes], dtype=np.int64)
        self.mem_free = np.array([n.memory_mib for n in nodes], dtype=np.int64)
        self.pods = np.zeros(len(nodes), dtype=np.int64)
        self.max_pods = np.array([n.max_pods for n in nodes], dtype=np.int64)
        self.models = sorted({n.model for n in nodes})
        self.model_id = np.array([self.models.index(n.model) for n in nodes], dtype=np.int64)
        # tie-break order among equally good nodes: inventory order unless shuffled once per run
        self.rank = np.arange(len(nodes), dtype=np.int64)
        # a node's version changes with its free capacity, so policies can cache per-node scores
        self.version = np.zeros(len(nodes), dtype=np.int64)
        self._tick = 0

    def shuffle_ties(self, rng) -> None:
        """One fixed random order of nodes for this run's ties (the FGD protocol)."""
        order = list(range(len(self.rank)))
        rng.shuffle(order)
        self.rank = np.array(order, dtype=np.int64)

    def copy(self) -> ClusterState:
        """An independent copy to try placements on (the inventory is shared, it never changes)."""
        clone = ClusterState.__new__(ClusterState)
        clone.__dict__.update(self.__dict__)
        for name in ("gpu_free", "cpu_free", "mem_free", "pods", "version"):
            setattr(clone, name, getattr(self, name).copy())
        return clone

    # --- queries -------------------------------------------------------------
    def model_mask(self, req: Request) -> np.ndarray:
        if not req.gpu_models or req.num_gpu == 0:
            return np.ones(len(self.rank), dtype=bool)
        ok = [m in req.gpu_models for m in self.models]
        return np.array(ok, dtype=bool)[self.model_id]

    def feasible(self, req: Request) -> np.ndarray:
        """Which nodes can take the request: CPU, memory, pod count, model and GPU room."""
        mask = (
            (self.cpu_free >= req.cpu_milli) & (self.mem_free >= req.memory_mib) & (self.pods < self.max_pods)
        )
        if req.num_gpu == 0:
            return mask
        mask &= self.model_mask(req)
        if req.is_sharing:
            return mask & (self.gpu_free >= req.gpu_milli).any(axis=1)
        return mask & ((self.gpu_free == MILLI_PER_GPU).sum(axis=1) >= req.num_gpu)

    def node_fits(self, i: int, req: Request) -> bool:
        return bool(self.feasible(req)[i])

    def fitting_gpus(self, i: int, req: Request) -> list[int]:
        """GPU indices on node i that could take (a part of) the request."""
        need = req.gpu_milli if req.is_sharing else MILLI_PER_GPU
        return [int(g) for g in np.flatnonzero(self.gpu_free[i] >= need)]

    def used_milli(self) -> int:
        present = self.gpu_free[self.gpu_free >= 0]
        return int(self.inventory.capacity_milli - present.sum())

    def node_gpu_free(self, i: int) -> list[int]:
        """Free milli of each GPU node i really has."""
        return [int(f) for f in self.gpu_free[i, : self.gpu_count[i]]]

    # --- changes -------------------------------------------------------------
    def apply(self, placement: Placement) -> None:
        i = self.inventory.index_of(placement.node)
        free = self.gpu_free[i]
        if len(set(placement.gpus)) != len(placement.gpus):
            raise InvalidRequest("a placement cannot use the same GPU twice")
        for g in placement.gpus:
            if not 0 <= g < self.gpu_count[i] or free[g] < placement.gpu_milli:
                raise InvalidRequest(f"GPU {g} on {placement.node} has no room for this placement")
        if self.cpu_free[i] < placement.cpu_milli or self.mem_free[i] < placement.memory_mib:
            raise InvalidRequest(f"{placement.node} has no CPU or memory left for this placement")
        for g in placement.gpus:
            free[g] -= placement.gpu_milli
        self.cpu_free[i] -= placement.cpu_milli
        self.mem_free[i] -= placement.memory_mib
        self.pods[i] += 1
        self._touch(i)

    def release(self, placement: Placement) -> None:
        i = self.inventory.index_of(placement.node)
        free = self.gpu_free[i]
        for g in placement.gpus:
            if not 0 <= g < self.gpu_count[i] or free[g] + placement.gpu_milli > MILLI_PER_GPU:
                raise InvalidRequest(f"GPU {g} on {placement.node} released more than it held")
        for g in placement.gpus:
            free[g] += placement.gpu_milli
        self.cpu_free[i] += placement.cpu_milli
        self.mem_free[i] += placement.memory_mib
        self.pods[i] -= 1
        self._touch(i)

    def hold(self, i: int, gpus: tuple[int, ...]) -> None:
        """Show GPUs of node `i` as full in this view (a scheduler keeping a spot for a job
        whose GPUs are still being freed); the real allocations are not touched."""
        for g in gpus:
            self.gpu_free[i, g] = min(self.gpu_free[i, g], 0)
        self._touch(i)

    def _touch(self, i: int) -> None:
        self._tick += 1
        self.version[i] = self._tick

    def placement_on(self, i: int, req: Request, gpus: list[int]) -> Placement:
        return Placement(
            node=self.inventory.nodes[i].name,
            gpus=tuple(int(g) for g in gpus),
            gpu_milli=req.gpu_milli if req.num_gpu else 0,
            cpu_milli=req.cpu_milli,
            memory_mib=req.memory_mib,
        )
