"""Parked shares: a workspace that gave its GPU back but keeps a claim to resume.

Pure: no clock, no I/O. A parked share holds **no capacity** (another user may spawn on its
GPU) but still counts against its owner's fixed build quota (so resuming never exceeds it).

The rule that orders resume claims against new spawns and train jobs
(`plan_claims` + `admit`), in words:

1. Only a parked share whose kernel asked for its GPU back (a *claim*, stamped with the time
   it was asked) competes for capacity; a parked share nobody uses takes nothing.
2. Claims are served first-come first-served: in claim order each claim is placed on a
   GPU of its own model, on its old GPU when that still has room (no UUID remap), otherwise
   by the placement policy. A claim that fits nowhere waits; later, smaller claims may pass
   it (no GPU is kept empty for it), but —
3. — a new build spawn or train job is admitted only where it leaves room for every claim
   that fits now, and never on a GPU model for which a claim is waiting: while a resume
   waits for a model, that model's freed capacity goes to the resume, not to a newcomer.
4. Claims never preempt build workspaces; like a spawn, a claim may make train jobs that
   borrow beyond their guarantee give their GPUs back (the hub asks the training pool).

`ClusterState.apply` still enforces capacity, so no order of these calls over-allocates.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, replace

from gpupool.pool.placement import Policy
from gpupool.pool.quotas import Holding
from gpupool.pool.request import Placement, Request
from gpupool.pool.state import ClusterState


@dataclass(frozen=True)
class ParkedShare:
    owner: str
    name: str  # server name ('' = default)
    node: str  # where it was parked (its old GPUs, preferred on resume)
    gpus: tuple[int, ...]
    gpu_milli: int  # per GPU
    model: str
    groups: tuple[str, ...] = ()
    parked_at: float = 0.0
    claimed_at: float | None = None  # when its kernel asked for the GPU back (None: no claim)
    pids: tuple[int, ...] = ()  # processes checkpointed (their GPU memory is in host memory)

    @property
    def total_milli(self) -> int:
        return len(self.gpus) * self.gpu_milli

    @property
    def key(self) -> tuple[str, str]:
        return (self.owner, self.name)

    def request(self) -> Request:
        return Request.for_gpus(self.total_milli, gpu_models=frozenset({self.model}))

    def claimed(self, now: float) -> ParkedShare:
        return self if self.claimed_at is not None else replace(self, claimed_at=now)


def claim_order(parked: list[ParkedShare]) -> list[ParkedShare]:
    """Waiting claims, first come first served (ties by owner and name, for determinism)."""
    return sorted(
        (p for p in parked if p.claimed_at is not None), key=lambda p: (p.claimed_at, p.owner, p.name)
    )


def place_claim(
    state: ClusterState, claim: ParkedShare, policy: Policy, rng: random.Random
) -> Placement | None:
    """Its old GPUs when they still have room, else any GPU of its model the policy picks."""
    req = claim.request()
    if claim.node in {n.name for n in state.inventory.nodes}:
        i = state.inventory.index_of(claim.node)
        old = [g for g in claim.gpus if 0 <= g < state.gpu_count[i]]
        if (
            len(old) == len(claim.gpus)
            and state.node_fits(i, req)
            and all(state.gpu_free[i, g] >= claim.gpu_milli for g in old)
        ):
            return state.placement_on(i, req, old)
    return policy.choose(state, req, rng)


@dataclass(frozen=True)
class ClaimPlan:
    granted: list[tuple[ParkedShare, Placement]]  # placed, in claim order (applied to the plan's view)
    waiting: list[ParkedShare]
    view: ClusterState  # the state with every granted claim applied

    @property
    def blocked_models(self) -> frozenset[str]:
        return frozenset(c.model for c in self.waiting)


def plan_claims(
    state: ClusterState, parked: list[ParkedShare], policy: Policy, rng: random.Random
) -> ClaimPlan:
    """Rule 2: place claims in order on a copy of `state`; `state` itself is not changed."""
    view = state.copy()
    granted, waiting = [], []
    for claim in claim_order(parked):
        spot = place_claim(view, claim, policy, rng)
        if spot is None:
            waiting.append(claim)
        else:
            view.apply(spot)
            granted.append((claim, spot))
    return ClaimPlan(granted, waiting, view)


def newcomer_view(
    state: ClusterState, parked: list[ParkedShare], policy: Policy, rng: random.Random
) -> ClusterState:
    """Rule 3 as a view: `state` with every claim that fits placed, and every GPU of a model
    a claim waits for shown full. New spawns and train jobs are placed on this view."""
    if not any(p.claimed_at is not None for p in parked):
        return state
    plan = plan_claims(state, parked, policy, rng)
    view = plan.view
    for model in plan.blocked_models:
        if model not in view.models:
            continue
        m = view.models.index(model)
        for i in [int(i) for i in (view.model_id == m).nonzero()[0]]:
            view.hold(i, tuple(range(int(view.gpu_count[i]))))
    return view


def admit(
    state: ClusterState, parked: list[ParkedShare], req: Request, policy: Policy, rng: random.Random
) -> Placement | None:
    """A placement for a newcomer that leaves room for the claims, or None."""
    return policy.choose(newcomer_view(state, parked, policy, rng), req, rng)


def quota_holdings(parked: list[ParkedShare], owner: str) -> list[Holding]:
    """A parked share still counts against its owner's fixed build quota."""
    return [Holding(p.name, p.total_milli, parked=True) for p in parked if p.owner == owner]
