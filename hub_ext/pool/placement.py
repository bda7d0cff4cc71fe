"""Placement policies: given the cluster state and a request, choose node and GPUs.

Every policy only *chooses*; ClusterState.apply enforces the invariants, so a buggy
policy cannot over-allocate. Choosing is pure: randomness comes in as an argument, and a
policy that learns the workload (frag-aware, fgd) learns only in `learn()`, called once per
request that really arrives, never while a scheduler tries placements out.
Scores are computed for all nodes at once (numpy); ties go to `state.rank`, inventory
order unless the run shuffled it.
"""

from __future__ import annotations

import copy
import random
from typing import Protocol

import numpy as np

from gpupool.pool.capacity import FragAware
from gpupool.pool.fragmentation import FGD, bestfit_score
from gpupool.pool.request import Placement, Request
from gpupool.pool.state import ClusterState
from gpupool.pool.units import MILLI_PER_GPU


class Policy(Protocol):
    name: str

    def choose(self, state: ClusterState, req: Request, rng: random.Random) -> Placement | None:
        """A placement for `req`, or None when it fits nowhere. Changes neither `state`
        nor anything the policy has learned."""
        ...

    def learn(self, req: Request) -> None:
        """Take into account one request that really arrived (a spawn, an admitted job,
        a simulated arrival); never called for trial placements."""
        ...


class Stateless:
    """A policy that learns nothing: its decisions depend on the state alone."""

    def learn(self, req: Request) -> None:
        pass


def gpus_for(
    state: ClusterState, i: int, req: Request, how: str = "tightest", rng: random.Random | None = None
) -> list[int]:
    """GPUs on node i: whole GPUs take the lowest-index free ones; a share takes the fitting
    GPU with the least room (`tightest`, lowest index on ties), a `random` one, or the `lowest`."""
    if req.num_gpu == 0:
        return []
    fitting = state.fitting_gpus(i, req)
    if not req.is_sharing:
        return fitting[: req.num_gpu]
    if how == "random" and rng is not None:
        return [rng.choice(fitting)]
    if how == "tightest":
        free = state.gpu_free[i]
        return [min(fitting, key=lambda g: (int(free[g]), g))]
    return fitting[:1]


def best_node(state: ClusterState, idx: np.ndarray, score: np.ndarray) -> int:
    """The node of idx with the highest score; ties to the lowest rank."""
    order = np.lexsort((state.rank[idx], -score))
    return int(idx[order[0]])


class FirstFit(Stateless):
    """The first node in inventory order that fits: simple and predictable."""

    name = "first-fit"

    def choose(self, state: ClusterState, req: Request, rng: random.Random) -> Placement | None:
        idx = np.flatnonzero(state.feasible(req))
        if idx.size == 0:
            return None
        i = int(idx[0])
        return state.placement_on(i, req, gpus_for(state, i, req, "lowest"))


class BestFit(Stateless):
    """The node with the least CPU and GPU left after placing (the FGD paper's BestFit)."""

    name = "best-fit"

    def choose(self, state: ClusterState, req: Request, rng: random.Random) -> Placement | None:
        idx = np.flatnonzero(state.feasible(req))
        if idx.size == 0:
            return None
        i = best_node(state, idx, bestfit_score(state, idx, req))
        return state.placement_on(i, req, gpus_for(state, i, req, "tightest"))


class GpuPacking(Stateless):
    """Fill partly used GPUs first, then nodes already in use, then empty nodes."""

    name = "gpu-packing"

    def choose(self, state: ClusterState, req: Request, rng: random.Random) -> Placement | None:
        idx = np.flatnonzero(state.feasible(req))
        if idx.size == 0:
            return None
        free = state.gpu_free[idx]
        if req.is_sharing:
            fitting = np.where(free >= req.gpu_milli, free, MILLI_PER_GPU + 1)
            score = -fitting.min(axis=1)  # the tightest fitting GPU anywhere
        elif req.num_gpu:
            score = -(free == MILLI_PER_GPU).sum(axis=1)  # fewest whole free GPUs left
        else:
            score = -state.cpu_free[idx]
        i = best_node(state, idx, score)
        return state.placement_on(i, req, gpus_for(state, i, req, "tightest"))


class Spread(Stateless):
    """The least allocated node, like the default Kubernetes scheduler (a baseline)."""

    name = "spread"

    def choose(self, state: ClusterState, req: Request, rng: random.Random) -> Placement | None:
        idx = np.flatnonzero(state.feasible(req))
        if idx.size == 0:
            return None
        free = np.where(state.gpu_free[idx] >= 0, state.gpu_free[idx], 0).sum(axis=1)
        i = best_node(state, idx, free * 1_000_000 + state.cpu_free[idx] // 1000)
        return state.placement_on(i, req, gpus_for(state, i, req, "lowest"))


class RandomFit(Stateless):
    """A uniformly random node that fits; a share goes to a random fitting GPU."""

    name = "random"

    def choose(self, state: ClusterState, req: Request, rng: random.Random) -> Placement | None:
        idx = np.flatnonzero(state.feasible(req))
        if idx.size == 0:
            return None
        i = int(idx[rng.randrange(idx.size)])
        return state.placement_on(i, req, gpus_for(state, i, req, "random", rng))


POLICIES: dict[str, type] = {
    p.name: p for p in (FragAware, FGD, BestFit, FirstFit, GpuPacking, Spread, RandomFit)
}
DEFAULT_POLICY = FragAware.name


def detached(policy: Policy) -> Policy:
    """`policy` to choose with on another thread while the hub's own goes on learning and
    choosing (frag-aware and fgd keep caches as they choose): a twin of what it learned; a
    stateless policy is itself."""
    if isinstance(policy, Stateless):
        return policy
    twin = getattr(policy, "twin", None)
    return twin() if twin is not None else copy.deepcopy(policy)


def get_policy(name: str) -> Policy:
    """A fresh policy object (frag-aware and fgd learn from what `learn()` is given)."""
    try:
        return POLICIES[name]()
    except KeyError:
        raise ValueError(f"unknown placement policy {name!r}; choose one of {sorted(POLICIES)}") from None
