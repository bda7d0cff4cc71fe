"""move: room for the head of the queue by moving idle notebooks, make-before-break.

Fractional workspaces pin their GPUs: a node whose GPUs each hold a quarter-share notebook
cannot take an 8-GPU gang, though most of its capacity is free. A notebook whose GPU is idle
can be moved without anything its user can see: its kernels' GPU memory is checkpointed on
GPU A, restored onto GPU B of the same model (UUID remapped by the driver) and A is freed.
Unlike KAI-Scheduler's consolidation (it evicts preemptible pods and recreates them) nothing
restarts, and unlike a reclaim nothing is stopped.

`plan_moves` is pure: given the pool (`state`, as the head may use it), the head of the queue
(a gang job, a large workspace, a resume claim: any `Request`) and the placed workspaces with
what the culler's samplers say about them, it returns the plan with the fewest moves (then the
least GPU memory copied) that lets the head start, or None. A workspace is never moved while
its GPU is busy, within `MoveRules.rest_s` of its last park, restore or move, nor more than
`MoveRules.per_hour` times in an hour; a plan has at most `MoveRules.max_moves` moves.

Make-before-break: every destination is planned on the pool with every source still held
(and the head's GPUs kept out), so the destinations are reserved before any source is
released, and no order of the steps' phases (reserve B, park on A, restore on B, release A)
over-allocates a GPU. All sources sit on the GPUs the head will take, so no move waits for
another. `carry_out` (gpupool.parking.mover) runs one step and returns the kernel to A when the
restore on B fails.

How (after KAI's consolidation solver, by node): a node is a candidate when enough of its GPUs
could be freed (free milli plus movable shares); candidates are tried in order of a lower bound
on their moves (GPUs still needed that are not free), and per node the GPUs in order of how
many workspaces must leave them (the largest first: fewest moves). The moved workspaces go
where the placement policy puts them, largest first, on a GPU of their own model.
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from gpupool.pool.placement import Policy
from gpupool.pool.request import Placement, Request
from gpupool.pool.state import ClusterState
from gpupool.pool.units import MILLI_PER_GPU

HOUR = 3600.0
ATTEMPTS_PER_NODE = 8  # GPU choices tried on one node before the next node (gang heads)


@dataclass(frozen=True)
class MoveRules:
    rest_s: float = 600.0  # no move within this long of the workspace's last park, restore or move
    per_hour: int = 2  # moves of one workspace in any hour
    max_moves: int = 4  # moves in one plan


@dataclass(frozen=True)
class Movable:
    """A placed workspace, as the mover sees it."""

    id: str  # "owner/name"
    placement: Placement
    model: str
    idle: bool  # the culler's samplers: no GPU work now (fresh data, idle at least a window)
    rested_since: float | None = None  # when its last park, restore or move ended (None: never)
    moved_at: tuple[float, ...] = ()  # when it was moved (older ones are ignored)
    memory_mib: int = 0  # GPU memory its kernels hold: what a move copies twice

    def request(self) -> Request:
        p = self.placement
        return Request(
            num_gpu=len(p.gpus),
            gpu_milli=p.gpu_milli,
            cpu_milli=p.cpu_milli,
            memory_mib=p.memory_mib,
            gpu_models=frozenset({self.model}),
        )

    @property
    def milli(self) -> int:
        return self.placement.total_milli


def why_not(ws: Movable, now: float, rules: MoveRules) -> str:
    """'' when `ws` may be moved now, else the reason in words."""
    if not ws.idle:
        return "its GPU is busy (or its use is not known)"
    if ws.rested_since is not None and now - ws.rested_since < rules.rest_s:
        return f"its GPU was parked, restored or moved {now - ws.rested_since:.0f} s ago"
    recent = sum(1 for t in ws.moved_at if now - t < HOUR)
    if recent >= rules.per_hour:
        return f"it was moved {recent} times in the last hour"
    return ""


@dataclass(frozen=True)
class Step:
    """One move: reserve `dest`, park the kernels on `source`, restore them on `dest`, release `source`."""

    id: str
    source: Placement
    dest: Placement
    memory_mib: int = 0


@dataclass(frozen=True)
class MovePlan:
    target: Placement  # where the head starts once every step is done
    steps: tuple[Step, ...]

    @property
    def memory_mib(self) -> int:
        return sum(s.memory_mib for s in self.steps)


def plan_moves(
    state: ClusterState,
    head: Request,
    workspaces: Iterable[Movable],
    now: float,
    rules: MoveRules,
    policy: Policy,
    rng: random.Random,
) -> MovePlan | None:
    """The plan with the fewest moves (then the least memory copied) after which `head` fits,
    or None (no plan within the rules). A head that fits already gets a plan of no steps.
    `state` is not changed; neither is anything the policy has learned."""
    spot = policy.choose(state, head, rng)
    if spot is not None:
        return MovePlan(spot, ())
    if head.num_gpu == 0 or rules.max_moves <= 0:
        return None  # moving GPU shares frees no CPU-only room worth a move
    movable = [w for w in workspaces if not why_not(w, now, rules)]
    # a workspace that fits on no GPU of its model as things are cannot move anywhere
    biggest = _biggest_room(state)
    movable = [w for w in movable if w.placement.gpu_milli <= biggest.get(w.model, 0)]
    if not movable:
        return None
    index = {n.name: i for i, n in enumerate(state.inventory.nodes)}
    on_gpu: dict[tuple[int, int], list[Movable]] = {}
    freeable = np.zeros_like(state.gpu_free)
    for w in movable:
        i = index.get(w.placement.node)
        if i is None:
            continue
        for g in w.placement.gpus:
            if 0 <= g < state.gpu_count[i] and state.gpu_free[i, g] >= 0:
                on_gpu.setdefault((i, g), []).append(w)
                freeable[i, g] += w.placement.gpu_milli
    need = head.gpu_milli if head.is_sharing else MILLI_PER_GPU
    k = head.num_gpu
    free = state.gpu_free
    could = (free >= 0) & (free + freeable >= need)
    ok = (could.sum(axis=1) >= k) & state.model_mask(head) & (state.pods < state.max_pods)
    ok &= state.cpu_free + _node_sum(movable, index, len(ok), "cpu_milli") >= head.cpu_milli
    ok &= state.mem_free + _node_sum(movable, index, len(ok), "memory_mib") >= head.memory_mib
    # a lower bound on a node's moves: one per GPU it still needs that is not free now; among
    # equal bounds, the nodes where the least must leave first (the likeliest to find room)
    bound = np.maximum(0, k - ((free >= need) & (free >= 0)).sum(axis=1))
    deficit = np.sort(np.where(could, np.maximum(0, need - free), 10 * MILLI_PER_GPU), axis=1)[:, :k].sum(
        axis=1
    )
    nodes = np.flatnonzero(ok & (bound <= rules.max_moves))
    search = _Search(state, head, need, on_gpu, rules, policy, rng)
    for i in nodes[np.lexsort((state.rank[nodes], deficit[nodes], bound[nodes]))]:
        if search.tries >= MAX_TRIES or (search.best is not None and bound[i] >= search.best[0][0]):
            break  # out of tries, or no node further on can need fewer moves
        search.node(int(i))
    return None if search.best is None else search.best[1]


def _biggest_room(state: ClusterState) -> dict[str, int]:
    """The most free milli on any one GPU, per GPU model."""
    top = state.gpu_free.max(axis=1)
    return {m: int(top[state.model_id == k].max(initial=0)) for k, m in enumerate(state.models)}


MAX_TRIES = 32  # node and GPU choices whose destinations are searched, per plan: bounded work per arrival


def _node_sum(movable: Sequence[Movable], index: dict[str, int], n: int, attr: str) -> np.ndarray:
    out = np.zeros(n, dtype=np.int64)
    for w in movable:
        i = index.get(w.placement.node)
        if i is not None:
            out[i] += getattr(w.placement, attr)
    return out


def _cost(off: Sequence[Movable]) -> tuple[int, int]:
    return (len(off), sum(w.memory_mib for w in off))


class _Search:
    """The best plan found so far, and one scratch copy of the pool on which destinations are
    tried and undone (one copy per plan keeps the policy's per-node caches warm)."""

    def __init__(
        self,
        state: ClusterState,
        head: Request,
        need: int,
        on_gpu: dict[tuple[int, int], list[Movable]],
        rules: MoveRules,
        policy: Policy,
        rng: random.Random,
    ) -> None:
        self.state, self.head, self.need, self.on_gpu = state, head, need, on_gpu
        self.rules, self.policy, self.rng = rules, policy, rng
        self.best: tuple[tuple[int, int], MovePlan] | None = None
        self.tries = 0
        self.scratch = state.copy()
        self._feasible: dict[tuple[object, ...], np.ndarray] = {}

    def node(self, i: int) -> None:
        """The cheapest plan that puts the head on node i, if cheaper than the best so far."""
        state, head, need = self.state, self.head, self.need
        options = []  # per GPU: (cost, free now, gpu, workspaces to move off it)
        for g in range(int(state.gpu_count[i])):
            free = int(state.gpu_free[i, g])
            if free < 0:
                continue
            off: list[Movable] = []
            # the largest first: the fewest moves that make room on this GPU
            for w in sorted(
                self.on_gpu.get((i, g), []), key=lambda w: (-w.placement.gpu_milli, w.memory_mib, w.id)
            ):
                if free >= need:
                    break
                off.append(w)
                free += w.placement.gpu_milli
            if free >= need:
                options.append((_cost(off), int(state.gpu_free[i, g]), g, off))
        k = head.num_gpu
        if len(options) < k:
            return
        # a share takes the tightest GPU that suits; whole GPUs any k, the cheapest first
        options.sort(key=lambda o: (o[0], o[1] if head.is_sharing else 0, o[2]))
        choices = (
            [[o] for o in options]
            if k == 1
            else sorted(itertools.combinations(options, k), key=lambda c: _cost([w for o in c for w in o[3]]))
        )
        for choice in choices[:ATTEMPTS_PER_NODE]:
            off = list({w.id: w for o in choice for w in o[3]}.values())
            cost = _cost(off)
            if len(off) > self.rules.max_moves or (self.best is not None and cost >= self.best[0]):
                continue  # combinations are sorted by the sum of their GPUs' costs, not their union's
            if self.tries >= MAX_TRIES:
                return
            plan = self._try(i, sorted(o[2] for o in choice), off)
            if plan is not None:
                self.best = (cost, plan)
                return

    def _try(self, i: int, gpus: list[int], off: list[Movable]) -> MovePlan | None:
        """Move `off` away from node i's `gpus` and put the head there: the plan, or None when
        the head would still not fit or a moved workspace fits nowhere with every source held."""
        state, head = self.state, self.head
        leaving = [w for w in off if w.placement.node == state.inventory.nodes[i].name]
        if (
            state.cpu_free[i] + sum(w.placement.cpu_milli for w in leaving) < head.cpu_milli
            or state.mem_free[i] + sum(w.placement.memory_mib for w in leaving) < head.memory_mib
        ):
            return None
        if not all(self._somewhere(w.request(), i, gpus) for w in off):
            return None
        self.tries += 1
        target = state.placement_on(i, head, gpus)
        # make-before-break: destinations are found on the pool with every source still held, the
        # head's GPUs (and its CPU and memory on node i) kept out of reach
        dests = self.scratch
        saved = (dests.gpu_free.copy(), dests.cpu_free.copy(), dests.mem_free.copy(), dests.pods.copy())
        dests.hold(i, tuple(gpus))
        dests.cpu_free[i] -= head.cpu_milli
        dests.mem_free[i] -= head.memory_mib
        steps = []
        try:
            for w in sorted(off, key=lambda w: (-w.milli, -w.memory_mib, w.id)):
                spot = self.policy.choose(dests, w.request(), self.rng)
                if spot is None:
                    return None
                dests.apply(spot)
                steps.append(Step(w.id, w.placement, spot, w.memory_mib))
            return MovePlan(target, tuple(steps))
        finally:
            # undo on the scratch copy; the rows changed get new versions, so no policy cache
            # keeps a score of the trial
            changed = np.flatnonzero(
                (dests.gpu_free != saved[0]).any(axis=1)
                | (dests.cpu_free != saved[1])
                | (dests.mem_free != saved[2])
                | (dests.pods != saved[3])
            )
            dests.gpu_free[:], dests.cpu_free[:], dests.mem_free[:], dests.pods[:] = saved
            for row in changed:
                dests._touch(int(row))

    def _somewhere(self, req: Request, i: int, gpus: list[int]) -> bool:
        """A quick necessary test: some node other than i could take `req`, or node i on a GPU
        the head does not take."""
        key = (req.num_gpu, req.gpu_milli, req.cpu_milli, req.memory_mib, req.gpu_models)
        mask = self._feasible.get(key)
        if mask is None:
            mask = self._feasible[key] = self.state.feasible(req)
        if mask[:i].any() or mask[i + 1 :].any():
            return True
        others = [g for g in self.state.fitting_gpus(i, req) if g not in gpus]
        return bool(mask[i]) and len(others) >= req.num_gpu


# --- carrying a plan out on a model of the pool (property tests, simulations) -------------
PHASES = ("reserve", "park", "restore", "release")


def apply_phase(state: ClusterState, step: Step, phase: str) -> None:
    """What one phase of a step does to the pool: only `reserve` (the destination is held) and
    `release` (the source is freed) change it; parking and restoring move memory, not shares."""
    if phase == "reserve":
        state.apply(step.dest)
    elif phase == "release":
        state.release(step.source)
    elif phase not in PHASES:
        raise ValueError(f"unknown phase {phase!r}")
