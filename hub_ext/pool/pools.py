"""Node pools: named groups of GPUs (by model, node or GPU index) that build profiles and
training projects may use, in an order of preference. Pure: a pool resolves to a mask over
the pool state's GPU slots."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .inventory import Inventory

OUTSIDE = -(10**6)  # a GPU slot outside the pools a job may use, in a view: never fits, even
# after a trial release of a job on it (release adds at most 1000)


@dataclass(frozen=True)
class NodePool:
    name: str
    models: frozenset[str] = frozenset()  # GPU models (e.g. "NVIDIA H100 80GB HBM3")
    nodes: frozenset[str] = frozenset()  # node names (Kubernetes: nodes with the pool's label)
    gpus: frozenset[int] = frozenset()  # GPU indices on every node (one machine: its cards)

    def has(self, node: str, index: int, model: str) -> bool:
        """Is GPU `index` of `node` (of `model`) in the pool? Every criterion given must hold."""
        return ((not self.models or model in self.models) and (not self.nodes or node in self.nodes)
                and (not self.gpus or index in self.gpus))

    def mask(self, inventory: Inventory, width: int) -> np.ndarray:
        """(nodes x width) booleans: which GPU slots of the pool state belong to the pool."""
        out = np.zeros((len(inventory.nodes), width), dtype=bool)
        for i, n in enumerate(inventory.nodes):
            for g, gpu in enumerate(n.gpus):
                out[i, g] = self.has(n.name, gpu.index, gpu.model)
        return out
