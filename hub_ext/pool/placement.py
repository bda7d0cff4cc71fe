"""Placement policies: given the cluster state and a request, choose node and GPUs.

Every policy only *chooses*; ClusterState.apply enforces the invariants, so a buggy
policy cannot over-allocate. Policies are pure: randomness comes in as an argument.
"""

from __future__ import annotations

import random
from typing import Protocol

from .request import Placement, Request
from .state import ClusterState
from .units import MILLI_PER_GPU


class Policy(Protocol):
    name: str

    def choose(self, state: ClusterState, req: Request, rng: random.Random) -> Placement | None:
        """A placement for `req`, or None when it fits nowhere. Must not change `state`."""
        ...


def gpus_for(state: ClusterState, i: int, req: Request, *, tightest: bool = True) -> list[int]:
    """GPUs on node i for the request: lowest-index free GPUs for whole GPUs; for a
    sharing request the fitting GPU with the least room (best fit) or the lowest index."""
    if req.num_gpu == 0:
        return []
    fitting = state.fitting_gpus(i, req)
    if not req.is_sharing:
        return fitting[: req.num_gpu]
    if tightest:
        free = state.gpu_free[i]
        return [min(fitting, key=lambda g: (free[g], g))]
    return fitting[:1]


class FirstFit:
    """The first node (inventory order) that fits; simple and predictable."""

    name = "first-fit"

    def choose(self, state: ClusterState, req: Request, rng: random.Random) -> Placement | None:
        for i in range(len(state.inventory.nodes)):
            if state.node_fits(i, req):
                return state.placement_on(i, req, gpus_for(state, i, req, tightest=False))
        return None


class BestFit:
    """The node with the least CPU and GPU left after placing (the FGD paper's BestFit)."""

    name = "best-fit"

    def choose(self, state: ClusterState, req: Request, rng: random.Random) -> Placement | None:
        best, best_score = None, None
        for i in range(len(state.inventory.nodes)):
            if not state.node_fits(i, req):
                continue
            cpu_left = state.cpu_free[i] - req.cpu_milli
            gpu_left = sum(state.gpu_free[i]) - req.total_milli
            score = int(100 * (1 - 0.5 * cpu_left / 128000 - 0.5 * gpu_left / (8 * MILLI_PER_GPU)))
            if best_score is None or score > best_score:
                best, best_score = i, score
        if best is None:
            return None
        return state.placement_on(best, req, gpus_for(state, best, req))


POLICIES: dict[str, type] = {p.name: p for p in (FirstFit, BestFit)}


def get_policy(name: str) -> Policy:
    try:
        return POLICIES[name]()
    except KeyError:
        raise ValueError(f"unknown placement policy {name!r}; choose one of {sorted(POLICIES)}") from None
