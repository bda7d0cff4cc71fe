"""Node pools: named groups of GPUs (by model, node or GPU index) that build profiles and
training projects may use, in an order of preference. Pure: a pool resolves to a mask over
the pool state's GPU slots."""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from gpupool.pool.errors import QuotaExceeded
from gpupool.pool.inventory import Inventory
from gpupool.pool.placement import Policy
from gpupool.pool.request import Placement, Request
from gpupool.pool.state import ClusterState


class PoolNotAllowed(QuotaExceeded):
    """A node pool the user's groups may not use (403)."""


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
        return (
            (not self.models or model in self.models)
            and (not self.nodes or node in self.nodes)
            and (not self.gpus or index in self.gpus)
        )

    def mask(self, inventory: Inventory, width: int) -> np.ndarray:
        """(nodes x width) booleans: which GPU slots of the pool state belong to the pool."""
        out = np.zeros((len(inventory.nodes), width), dtype=bool)
        for i, n in enumerate(inventory.nodes):
            for g, gpu in enumerate(n.gpus):
                out[i, g] = self.has(n.name, gpu.index, gpu.model)
        return out


def within(state: ClusterState, pools: Sequence[NodePool]) -> ClusterState:
    """A copy of `state` where only the GPUs of `pools` have room (the others look full)."""
    view = state.copy()
    mask = np.zeros_like(view.gpu_free, dtype=bool)
    for pool in pools:
        mask |= pool.mask(state.inventory, view.gpu_free.shape[1])
    view.gpu_free[~mask] = OUTSIDE
    view.version[:] += 1  # policies cache per-node scores by version
    return view


def choose_in_pools(
    policy: Policy, state: ClusterState, request: Request, rng: random.Random, pools: Sequence[NodePool]
) -> Placement | None:
    """A placement in the first of `pools` (in order of preference) where `request` fits;
    anywhere when no pool is given."""
    if not pools:
        return policy.choose(state, request, rng)
    for pool in pools:
        placement = policy.choose(within(state, [pool]), request, rng)
        if placement is not None:
            return placement
    return None


def allowed_pools(offered: Sequence[str], defined: Sequence[str], chosen: str | None) -> tuple[str, ...]:
    """The pools a workspace may use: `chosen` alone when it is one of `offered` (every
    `defined` pool when `offered` is empty), else all of `offered` in their order. Raises
    PoolNotAllowed for a pool that is not offered."""
    allowed = tuple(offered) or tuple(defined)
    if chosen is None or chosen == "":
        return tuple(offered)
    if chosen not in allowed:
        names = ", ".join(allowed) or "none are defined"
        raise PoolNotAllowed(f"node pool {chosen[:64]!r} is not one you may use: choose one of {names}")
    return (chosen,)
