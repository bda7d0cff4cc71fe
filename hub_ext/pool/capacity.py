"""The default placement policy: usable GPU capacity for a target workload learned online.

GPU fragmentation with respect to a target workload (after FGD, ATC'23), and the
target workload itself, learned online from the requests seen so far.

A node's fragmentation for a task shape s is the idle GPU milli that s cannot use:
all of it when the node cannot host s at all (CPU, GPU model, GPU room), else the
idle milli on GPUs that have less left than s needs per GPU. Weighted over the
target shapes: F(node) = sum_s w_s * (T - h_s * Q_s), where T is the node's idle
milli, h_s whether the node can host s, and Q_s the idle milli s could use (on the
GPUs with at least s's per-GPU need). So F = T * W - U with the *usable* capacity

    U(node) = sum_s w_s * h_s * Q_s,

and since a placement lowers T by exactly the pod's GPU milli wherever it goes, the
placement that raises F least is the one that lowers U least.

FGD's U ignores how much CPU is left beyond "enough for one more task": a node with
8 idle GPUs and CPU for one task counts all 8 GPUs as usable. The policy therefore
adds a CPU-aware term: for each shape, the usable milli capped by the tasks of that
shape the node's CPU can still take (min(Q_s, CPU slots x per-task milli)). On the
openb trace this term is what moves CPU-only and CPU-heavy tasks off CPU-poor GPU
nodes (see docs/placement.md). This module computes U for many nodes (and
candidate GPUs) at once with numpy.

Shapes that need no GPU add the same amount to every candidate's change of F, so
they are counted as requests but left out of U.
"""

from __future__ import annotations

import copy
import random
from dataclasses import dataclass

import numpy as np

from gpupool.pool.node_classes import NodeIndex, gpu_with
from gpupool.pool.request import Placement, Request
from gpupool.pool.state import ClusterState
from gpupool.pool.units import MILLI_PER_GPU


@dataclass(frozen=True)
class Shape:
    """A task shape of the target workload and its weight (how often it was seen)."""

    cpu_milli: int
    num_gpu: int
    gpu_milli: int
    gpu_models: frozenset[str]
    weight: float
    memory_mib: int = 0  # the mean memory of the requests of this shape

    @property
    def is_sharing(self) -> bool:
        return self.num_gpu == 1 and self.gpu_milli < MILLI_PER_GPU


def shape_key(req: Request) -> tuple[int, int, int, frozenset[str]]:
    return (req.cpu_milli, req.num_gpu, req.gpu_milli if req.num_gpu else 0, req.gpu_models)


class OnlineTarget:
    """The workload the cluster is likely to receive, learned from requests so far.

    Counts every request's shape (CPU, GPU count, per-GPU milli, allowed models).
    `shapes()` returns the most frequent shapes covering `coverage` of the requests,
    weighted by frequency, as FGD's target workload, but from the past only: nothing
    is read ahead. With `half_life` (in requests) a request counts half as much after
    `half_life` further requests, so the target follows a workload that changes (a new
    semester, a new team). At most `max_shapes` distinct shapes are kept (the lightest
    go first), so a long-running hub's learner stays small whatever users ask for.

    `learn()` is the only method that changes it; `shapes()` only reads.
    """

    def __init__(
        self, coverage: float = 0.95, half_life: float | None = None, max_shapes: int = 1024
    ) -> None:
        if not 0 < coverage <= 1:
            raise ValueError("coverage must be in (0, 1]")
        if half_life is not None and not half_life > 0:
            raise ValueError("half_life must be > 0 requests (or None: never forget)")
        if max_shapes < 1:
            raise ValueError("max_shapes must be >= 1")
        self.coverage = coverage
        self.half_life = half_life
        self.max_shapes = max_shapes
        # with a half-life, weights are stored relative to request number `_base`: a new
        # request adds 2^((seen - _base) / half_life) instead of shrinking every old count
        self.counts: dict[tuple[int, int, int, frozenset[str]], float] = {}
        self.memory: dict[tuple[int, int, int, frozenset[str]], float] = {}
        self.seen = 0
        self._base = 0

    def _unit(self) -> float:
        return 2.0 ** ((self.seen - self._base) / self.half_life) if self.half_life else 1.0

    def learn(self, req: Request) -> None:
        """Count one request that really arrived (never a trial placement)."""
        key = shape_key(req)
        unit = self._unit()
        if unit > 2.0**20:  # rebase before the stored weights grow out of float range
            self.counts = {k: v / unit for k, v in self.counts.items() if v / unit > 1e-6}
            self.memory = {k: self.memory[k] / unit for k in self.counts}
            self._base, unit = self.seen, 1.0
        self.counts[key] = self.counts.get(key, 0.0) + unit
        self.memory[key] = self.memory.get(key, 0.0) + unit * req.memory_mib
        self.seen += 1
        if len(self.counts) > self.max_shapes:
            # drop the lightest quarter at once, so the cut happens rarely
            keep = sorted(self.counts, key=lambda k: (-self.counts[k], _sortable(k)))[
                : self.max_shapes * 3 // 4
            ]
            self.counts = {k: self.counts[k] for k in keep}
            self.memory = {k: self.memory[k] for k in keep}

    def shapes(self) -> list[Shape]:
        """The target workload now: shapes with their weight in (decayed) requests."""
        unit = self._unit()
        total = sum(self.counts.values())
        out: list[Shape] = []
        acc = 0.0
        # ties in frequency go to the smaller key, so the result is reproducible
        for key, count in sorted(self.counts.items(), key=lambda kv: (-kv[1], _sortable(kv[0]))):
            if acc >= self.coverage * total:
                break
            mem = int(self.memory.get(key, 0.0) / count)
            weight = count if unit == 1.0 else count / unit
            out.append(Shape(key[0], key[1], key[2], key[3], weight, mem))
            acc += count
        return out


def _sortable(key: tuple[int, int, int, frozenset[str]]) -> tuple[int, int, int, list[str]]:
    return (key[0], key[1], key[2], sorted(key[3]))


def _free(state: ClusterState, idx: np.ndarray) -> np.ndarray:
    """Free milli per GPU; GPUs a node does not have count as 0 (never fit, add nothing)."""
    return np.maximum(state.gpu_free[idx], 0)


def _full(state: ClusterState, idx: np.ndarray) -> np.ndarray:
    return (state.gpu_free[idx] == MILLI_PER_GPU).sum(axis=1)


def _models(state: ClusterState, models: frozenset[str]) -> np.ndarray:
    if not models:
        return np.ones(len(state.model_id), dtype=bool)
    return np.array([m in models for m in state.models], dtype=bool)[state.model_id]


def _whole_weights(weights: list[float]) -> list[float]:
    """Weights as whole numbers (decayed ones scaled to at most 2^20), so that scores are
    exact sums and two placements that lose the same capacity tie exactly."""
    if all(float(w).is_integer() for w in weights) and max(weights, default=0) < 2**20:
        return [float(w) for w in weights]
    top = max(weights)
    return [float(max(1, round(w * 2**20 / top))) for w in weights]


class FragModel:
    """The target shapes compiled against one cluster's nodes, for vectorised U.

    `usable` / `best_after` give the policy's U (FGD's usable capacity plus, with
    `cpu_aware`, the CPU-capped one); `fragmentation` gives FGD's F for reports.
    """

    def __init__(
        self, state: ClusterState, shapes: list[Shape], *, cpu_aware: bool = True, size_exponent: float = 0.0
    ) -> None:
        share = [s for s in shapes if s.num_gpu and s.is_sharing]
        whole = [s for s in shapes if s.num_gpu and not s.is_sharing]
        self.cpu_aware = cpu_aware
        # a shape's weight: how often it is asked for, times (GPUs it asks for) ^ size_exponent
        weight = _whole_weights(
            [s.weight * (s.num_gpu * s.gpu_milli / MILLI_PER_GPU) ** size_exponent for s in share + whole]
        )
        self.weight_total = float(sum(weight))
        # sharing shapes: the distinct per-GPU needs x_j, each shape's column j(s)
        self.thresholds = np.array(sorted({s.gpu_milli for s in share}), dtype=np.int64)
        col = {x: j for j, x in enumerate(self.thresholds.tolist())}
        self.share_col = np.array([col[s.gpu_milli] for s in share], dtype=np.int64)
        self.share_milli = np.array([s.gpu_milli for s in share], dtype=np.int64)
        self.share_cpu = np.array([s.cpu_milli for s in share], dtype=np.int64)
        self.whole_k = np.array([s.num_gpu for s in whole], dtype=np.int64)
        self.whole_cpu = np.array([s.cpu_milli for s in whole], dtype=np.int64)
        # weight of each shape on each GPU model (0 where the model is not allowed), looked up by
        # the nodes' models when scored: a refreshed target costs (models x shapes), not (nodes x shapes)
        self.model_id = state.model_id
        allowed = np.array(
            [[not s.gpu_models or m in s.gpu_models for s in share + whole] for m in state.models],
            dtype=float,
        ).reshape(len(state.models), len(share) + len(whole))
        wm = allowed * np.array(weight, dtype=float)
        self.share_wm, self.whole_wm = wm[:, : len(share)], wm[:, len(share) :]

    # --- building blocks -------------------------------------------------------
    def _q(self, free: np.ndarray) -> np.ndarray:
        """(..., J): idle milli on GPUs with at least x_j left, from free (..., G)."""
        f = free[..., None]
        return (f * (f >= self.thresholds)).sum(axis=-2)

    @staticmethod
    def _slots(cpu: np.ndarray, need: np.ndarray) -> np.ndarray:
        """(M, S): how many tasks of each shape the CPU left can take."""
        return np.where(need > 0, cpu[:, None] // np.maximum(need, 1), np.int64(1 << 40))

    def _u(
        self, idx: np.ndarray, cpu: np.ndarray, q: np.ndarray, nf: np.ndarray, *, cpu_aware: bool
    ) -> np.ndarray:
        """U from the CPU left (M,), Q (M, J) and whole free GPUs (M,)."""
        return self._u_share(idx, cpu, q, cpu_aware=cpu_aware) + self._u_whole(
            idx, cpu, nf, cpu_aware=cpu_aware
        )

    # U is a sum of exact integers (whole weights x milli): its two parts can be added in any
    # order, and computed on different rows (a share's part per candidate GPU, the whole GPUs'
    # part per node and count of whole free GPUs)
    def _u_share(
        self,
        idx: np.ndarray,
        cpu: np.ndarray,
        q: np.ndarray,
        *,
        cpu_aware: bool,
        rows: np.ndarray | None = None,
    ) -> np.ndarray:
        """The sharing shapes' part of U, from the CPU left (M,) and Q (M, J); with `rows`, Q
        has one row per candidate, on node rows[i]."""
        cs = self._slots(cpu, self.share_cpu)  # (M, S1)
        ws = self.share_wm[self.model_id[idx]]
        if rows is not None:
            cs, ws = cs[rows], ws[rows]
        qs = q[..., self.share_col]
        # FGD: a shape the node can host (CPU for one more task, GPU room) can use Q_s
        u = (ws * (cs > 0) * qs).sum(axis=-1)
        if cpu_aware:
            # ... but only as many of its tasks as the CPU left can take
            u = u + (ws * np.minimum(qs, cs * self.share_milli)).sum(axis=-1)
        return u

    def _u_whole(
        self,
        idx: np.ndarray,
        cpu: np.ndarray,
        nf: np.ndarray,
        *,
        cpu_aware: bool,
        less: tuple[int, ...] = (0,),
    ) -> np.ndarray:
        """The whole-GPU shapes' part of U, from the CPU left (M,) and whole free GPUs (M,);
        with `less`, one row per value: nf minus that many (the slots are counted once)."""
        cw = self._slots(cpu, self.whole_cpu)  # (M, S2)
        ww = self.whole_wm[self.model_id[idx]]
        k = self.whole_k
        out = []
        for minus in less:
            n = (nf - minus)[..., None]
            u = (ww * ((cw > 0) & (n >= k)) * n * MILLI_PER_GPU).sum(axis=-1)
            if cpu_aware:
                u = u + (ww * np.minimum(n // k, cw) * k * MILLI_PER_GPU).sum(axis=-1)
            out.append(u)
        return out[0] if less == (0,) else np.stack(out)

    # --- what the policy and the reports call ---------------------------------
    def usable(self, state: ClusterState, idx: np.ndarray) -> np.ndarray:
        """U of nodes `idx` as they are now."""
        return self._u(
            idx, state.cpu_free[idx], self._q(_free(state, idx)), _full(state, idx), cpu_aware=self.cpu_aware
        )

    def best_after(self, state: ClusterState, idx: np.ndarray, req: Request) -> tuple[np.ndarray, np.ndarray]:
        """For each node in `idx` (all of which fit `req`): U after placing `req` there
        on its best GPU, and that GPU (-1 for whole-GPU and CPU-only requests, which
        take the lowest-index free GPUs). For a sharing request every fitting GPU is
        tried; ties go to the GPU with the least room left, then the lowest index."""
        cpu = state.cpu_free[idx] - req.cpu_milli
        free = _free(state, idx)
        nf = _full(state, idx)
        if not req.is_sharing:
            k = req.num_gpu
            # whole GPUs taken are completely free, so they counted at every threshold
            q = self._q(free) - MILLI_PER_GPU * k
            u = self._u(idx, cpu, q, nf - k, cpu_aware=self.cpu_aware)
            return u, np.full(len(idx), -1, dtype=np.int64)
        d = req.gpu_milli
        x = self.thresholds
        # the candidates: on each node, one GPU per distinct free share that fits (GPUs with
        # the same room are the same choice), in ascending order of room
        srt = np.sort(free, axis=1)
        fresh = np.ones_like(srt, dtype=bool)
        fresh[:, 1:] = srt[:, 1:] != srt[:, :-1]
        rows, cols = np.nonzero(fresh & (srt >= d))
        a = srt[rows, cols]  # (P,): the room of the GPU that would take the request
        # The GPU that takes the task is charged in task slots: for a shape needing x
        # it loses x * (floor(a / x) - floor((a - d) / x)), so a task that fits in the
        # remainder a mod x costs that shape nothing (FGD would charge d whenever
        # a - d >= x, which cannot tell the GPUs of a node apart).
        q = self._q(free)[rows] - (a[:, None] // x) * x + ((a[:, None] - d) // x) * x  # (P, J)
        u = self._u_share(idx, cpu, q, cpu_aware=self.cpu_aware, rows=rows)
        # the whole-GPU part only sees whether the GPU taken was whole: two values per node
        whole = self._u_whole(idx, cpu, nf, cpu_aware=self.cpu_aware, less=(0, 1))
        u = u + whole[(a == MILLI_PER_GPU).astype(np.int64), rows]
        # per node: the best candidate, ties to the least room (the first: rooms ascend)
        out_u, out_gpu = np.full(len(idx), -np.inf), np.full(len(idx), -1, dtype=np.int64)
        if not len(rows):
            return out_u, out_gpu
        starts = np.flatnonzero(np.r_[True, rows[1:] != rows[:-1]])
        group = np.repeat(np.arange(len(starts)), np.diff(np.r_[starts, len(u)]))
        best = np.maximum.reduceat(u, starts)
        first = np.minimum.reduceat(np.where(u == best[group], np.arange(len(u)), len(u)), starts)
        nodes = rows[starts]
        out_u[nodes] = best
        # ... on the lowest-index GPU with that room
        out_gpu[nodes] = np.argmax(free[nodes] == a[first][:, None], axis=1)
        return out_u, out_gpu


# --- the policy --------------------------------------------------------------
# Like FGD it scores a node and a GPU by the change of usable capacity for the target
# workload; unlike the published FGD the target is learned from the requests seen so far,
# the usable capacity is CPU-aware (how many tasks of a shape the CPU left can take), a
# sharing task charges the GPU that takes it in task slots, and the score is exact with
# ties to the run's fixed node order. A node's score for a request shape is cached until
# the node changes (ClusterState.version) or the target is refreshed.


def _lowest_gpus(state: ClusterState, i: int, req: Request) -> list[int]:
    if req.num_gpu == 0:
        return []
    return [int(g) for g in np.flatnonzero(state.gpu_free[i] == MILLI_PER_GPU)[: req.num_gpu]]


class _ShapeCache:
    __slots__ = ("gpu", "u_after", "version")

    def __init__(self, n: int) -> None:
        self.version = np.full(n, -1, dtype=np.int64)
        self.u_after = np.zeros(n)
        self.gpu = np.full(n, -1, dtype=np.int64)


class FragAware:
    """Least loss of usable GPU capacity for the workload seen so far (the default).

    Pure when choosing: `choose()` reads the target snapshot taken by the last `learn()`,
    so trial placements (planning a reclaim, a consolidation) never change what later
    decisions see. Call `learn(req)` once per request that really arrives.
    """

    name = "frag-aware"
    # A request counts half after this many further requests: on a busy hub (hundreds of
    # spawns a day) about two weeks, so a new term's workload takes over within weeks;
    # on the openb protocol (10-20k requests) it costs nothing measurable.
    HALF_LIFE = 5000
    MAX_CACHED_SHAPES = 256  # request shapes with cached scores; beyond, the caches start over
    # A shape's capacity counts by frequency x (GPUs it asks for)^-1/2: near a full cluster
    # the holes are filled by small tasks, so their room is worth more per request than a
    # rare 8-GPU job's (benchmarks/placement: +0.1..1 point on multi-GPU and CPU-heavy
    # mixes, no change on openb default; exponent 0 is FGD's weighting, -1 loses 0.7 points
    # on a sharing-heavy mix).
    SIZE_EXPONENT = -0.5
    # score nodes by classes of alike nodes (node_classes.py) when this many need scoring at
    # once (a new request shape, a refreshed target): below, grouping costs more than it saves
    CLASSES_FROM = 64

    def __init__(
        self,
        coverage: float = 0.95,
        half_life: float | None = HALF_LIFE,
        refresh_every: int = 1024,
        max_shapes: int = 1024,
    ) -> None:
        self.target = OnlineTarget(coverage=coverage, half_life=half_life, max_shapes=max_shapes)
        self.refresh_every = refresh_every
        self._shapes: list[Shape] = []  # the target as of the last refresh: what choose() uses
        self._generation = 0
        self._built = -1  # the generation the caches were computed for
        self._state: ClusterState | None = None
        self._model: FragModel | None = None
        self._u_now: _ShapeCache | None = None
        self._caches: dict[tuple[int, int, int], _ShapeCache] = {}
        self._index: NodeIndex | None = None

    def twin(self) -> FragAware:
        """What this policy has learned, none of its caches: one to choose with on another
        thread (the start estimates' replay) while this one goes on learning and choosing."""
        twin = copy.copy(self)
        twin.target = copy.deepcopy(self.target)
        twin._shapes = list(self._shapes)
        twin._built, twin._state, twin._model, twin._u_now, twin._index = -1, None, None, None, None
        twin._caches = {}
        return twin

    def _due(self) -> bool:
        """Refresh the target at 1, 2, 4 ... requests, then every `refresh_every`:
        often while little is known, rarely once the mix is stable (each refresh
        drops the cached scores)."""
        n = self.target.seen
        if n <= self.refresh_every:
            return n & (n - 1) == 0
        return n % self.refresh_every == 0

    def learn(self, req: Request) -> None:
        self.target.learn(req)
        if self._due():
            self._shapes = self.target.shapes()
            self._generation += 1

    def _reset(self, state: ClusterState) -> None:
        self._state = state
        self._built = self._generation
        self._model = FragModel(state, self._shapes, size_exponent=self.SIZE_EXPONENT)
        n = len(state.inventory.nodes)
        self._u_now = _ShapeCache(n)
        self._caches = {}
        if self._index is None or self._index.state is not state:
            self._index = NodeIndex(state)  # kept across target refreshes: it depends on the state alone

    def _best_after(
        self, model: FragModel, state: ClusterState, nodes: np.ndarray, req: Request
    ) -> tuple[np.ndarray, np.ndarray]:
        """model.best_after for `nodes`, scoring one node per class of alike nodes."""
        if len(nodes) < self.CLASSES_FROM:
            return model.best_after(state, nodes, req)
        assert self._index is not None
        reps, inverse = self._index.classes(nodes)
        u, gpu = model.best_after(state, reps, req)
        if not req.is_sharing:
            return u[inverse], gpu[inverse]
        return u[inverse], gpu_with(state, nodes, state.gpu_free[reps, gpu][inverse])

    def _usable(self, model: FragModel, state: ClusterState, nodes: np.ndarray) -> np.ndarray:
        if len(nodes) < self.CLASSES_FROM:
            return model.usable(state, nodes)
        assert self._index is not None
        reps, inverse = self._index.classes(nodes)
        return model.usable(state, reps)[inverse]

    def choose(self, state: ClusterState, req: Request, rng: random.Random) -> Placement | None:
        # the caches are a memo of (target snapshot, this state): rebuilt when either changes
        if state is not self._state or self._built != self._generation:
            self._reset(state)
        rank = state.rank
        assert self._index is not None
        idx = np.flatnonzero(self._index.feasible(req))
        if not len(idx):
            return None
        model, now = self._model, self._u_now
        assert model is not None and now is not None
        key = (req.cpu_milli, req.num_gpu, req.gpu_milli if req.num_gpu else 0)
        cache = self._caches.get(key)
        if cache is None:
            if len(self._caches) >= self.MAX_CACHED_SHAPES:
                self._caches = {}  # bounded memory whatever shapes the hub is asked for
            cache = self._caches[key] = _ShapeCache(len(state.inventory.nodes))
        ver = state.version[idx]
        stale = idx[cache.version[idx] != ver]
        if len(stale):
            cache.u_after[stale], cache.gpu[stale] = self._best_after(model, state, stale, req)
            cache.version[stale] = state.version[stale]
        stale = idx[now.version[idx] != ver]
        if len(stale):
            now.u_after[stale] = self._usable(model, state, stale)
            now.version[stale] = state.version[stale]
        # the loss of usable capacity, to be kept as small as possible; ties to the lowest rank
        gain = cache.u_after[idx] - now.u_after[idx]
        best = idx[gain == gain.max()]
        i = int(best[np.argmin(rank[best])])
        if req.is_sharing:
            return state.placement_on(i, req, [int(cache.gpu[i])])
        return state.placement_on(i, req, _lowest_gpus(state, i, req))
