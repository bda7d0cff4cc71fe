"""Fragmentation-aware placement (after FGD, "Beware of Fragmentation", ATC'23), with the
target workload learned online from the requests seen so far.

A node's fragmentation for a workload shape s (CPU, per-GPU milli, GPU count, models):
  * if the node cannot host s at all: all its idle GPU milli;
  * otherwise: the idle milli on GPUs that have less left than s needs per GPU.
(A CPU-only shape never uses a GPU, so to it all idle GPU milli is fragment, as in the
FGD authors' simulator.) A node's expected fragmentation is the frequency-weighted sum
over the shapes that cover 95 % of the requests seen so far. A request goes where it
raises the expected fragmentation least, scored like a Kubernetes plugin on 0..100
(sigmoid of the decrease / `scale`); equal scores go to the run's fixed tie order.
Inside a node, a share goes to the GPU with the least rise (then the tightest GPU).

Measured on the openb trace (benchmarks/placement): the 0..100 quantisation matters: the
exact float minimum piles pods onto the few marginally best nodes and strands ~1 point
more GPU; a scale of 2000 instead of FGD's 1000 groups near-equal placements a little
more widely, which is where our gain over FGD comes from.

Engineering: nodes in the same state score the same, so candidates are de-duplicated by
a hash of (model, CPU bucket before/after, sorted free milli per GPU), and the score after
taking one GPU share is computed incrementally from per-node sums rather than by
re-scoring whole nodes. One decision on 1,213 nodes costs well under a millisecond.
"""

from __future__ import annotations

import copy
import random
from collections import Counter
from dataclasses import dataclass

import numpy as np

from gpupool.pool.request import Placement, Request
from gpupool.pool.state import ClusterState
from gpupool.pool.units import MILLI_PER_GPU

Shape = tuple[int, int, int, frozenset[str]]
CPU_SHAPES_IDLE = False  # cpu_milli, num_gpu, gpu_milli, models


def shape_of(req: Request) -> Shape:
    models = req.gpu_models if req.num_gpu else frozenset()
    return (req.cpu_milli, req.num_gpu, req.gpu_milli if req.num_gpu else 0, frozenset(models))


@dataclass
class ShapeArrays:
    cpu: np.ndarray  # (K,)
    need: np.ndarray  # per-GPU milli a shape needs: share, 1000 for whole GPUs, 0 for CPU-only
    num: np.ndarray  # GPUs per instance (0 for CPU-only)
    sharing: np.ndarray  # bool
    model_ok: np.ndarray  # (K, models) bool
    p: np.ndarray  # frequencies, summing to 1
    cpu_cuts: np.ndarray  # sorted distinct CPU demands: a node's CPU matters only up to these


class TargetWorkload:
    """The shapes requested so far; the most frequent ones covering `coverage` of requests.

    `learn()` counts a request and, on the refresh schedule, takes the snapshot that
    `arrays()` compiles; `arrays()` only reads, so trial placements change nothing.
    At most `max_shapes` distinct shapes are counted (the rarest go first)."""

    def __init__(self, coverage: float = 0.95, refresh: int = 64, max_shapes: int = 1024) -> None:
        self.coverage = coverage
        self.refresh = refresh
        self.max_shapes = max_shapes
        self.counts: Counter[Shape] = Counter()
        self.seen = 0
        self._chosen = self._choose()
        self._built_at = -1
        self._arrays: ShapeArrays | None = None
        self._models: list[str] = []

    def learn(self, req: Request) -> None:
        self.counts[shape_of(req)] += 1
        self.seen += 1
        if len(self.counts) > self.max_shapes:
            self.counts = Counter(dict(self.counts.most_common(self.max_shapes * 3 // 4)))
        # early on every request changes the picture; later the mix is stable
        if self.seen - self._built_at >= min(self.refresh, max(1, self._built_at)):
            self._chosen, self._built_at, self._arrays = self._choose(), self.seen, None

    def arrays(self, models: list[str]) -> ShapeArrays:
        if self._arrays is None or models != self._models:
            self._arrays, self._models = self._build(models), list(models)
        return self._arrays

    def _choose(self) -> list[tuple[Shape, int]]:
        total = sum(self.counts.values())
        chosen: list[tuple[Shape, int]] = []
        covered = 0
        for shape, n in sorted(self.counts.items(), key=lambda kv: (-kv[1], repr(kv[0]))):
            chosen.append((shape, n))
            covered += n
            if covered >= self.coverage * total:
                break
        return chosen or [((0, 1, MILLI_PER_GPU, frozenset()), 1)]

    def _build(self, models: list[str]) -> ShapeArrays:
        chosen = self._chosen
        cpu = np.array([s[0] for s, _ in chosen], dtype=np.int64)
        num = np.array([s[1] for s, _ in chosen], dtype=np.int64)
        milli = np.array([s[2] for s, _ in chosen], dtype=np.int64)
        sharing = (num == 1) & (milli < MILLI_PER_GPU)
        need = np.where(num == 0, 0, np.where(sharing, milli, MILLI_PER_GPU))
        model_ok = np.array(
            [[(not s[3]) or (m in s[3]) or s[1] == 0 for m in models] for s, _ in chosen], dtype=bool
        )
        weights = np.array([n for _, n in chosen], dtype=np.float64)
        return ShapeArrays(cpu, need, num, sharing, model_ok, weights / weights.sum(), np.unique(cpu))


def _frag(shapes: ShapeArrays, idle, hfrag, can) -> np.ndarray:
    """Expected fragmentation from idle milli (...), per-shape hostable fragments (..., K)
    and per-shape can-host flags (..., K)."""
    return (np.where(can, hfrag, idle[..., None]) * shapes.p).sum(axis=-1)


def _node_terms(shapes: ShapeArrays, rows: np.ndarray, cpu: np.ndarray, model: np.ndarray):
    """idle (C,), hostable fragments (C, K), can-host (C, K), plus helpers for increments."""
    present = rows >= 0
    idle = np.where(present, rows, 0).sum(axis=1)
    below = present[:, None, :] & (rows[:, None, :] < shapes.need[None, :, None])
    hfrag = np.where(below, rows[:, None, :], 0).sum(axis=2)
    full = (rows == MILLI_PER_GPU).sum(axis=1)
    top = rows.max(axis=1)
    can = _can_host(shapes, cpu, model, full, top)
    return idle, hfrag, can, full, top


def _can_host(shapes: ShapeArrays, cpu, model, full, top) -> np.ndarray:
    gpu_ok = np.where(
        shapes.num[None, :] == 0,
        False,  # a CPU-only shape never uses a GPU: all idle GPU milli is fragment to it
        np.where(
            shapes.sharing[None, :],
            top[:, None] >= shapes.need[None, :],
            full[:, None] >= shapes.num[None, :],
        ),
    )
    return gpu_ok & (cpu[:, None] >= shapes.cpu[None, :]) & shapes.model_ok[:, model].T


def bestfit_score(state: ClusterState, idx: np.ndarray, req: Request) -> np.ndarray:
    """The FGD paper's BestFit score of nodes idx (higher = tighter)."""
    cpu_left = state.cpu_free[idx] - req.cpu_milli
    gpu_left = np.where(state.gpu_free[idx] >= 0, state.gpu_free[idx], 0).sum(axis=1) - req.total_milli
    return np.floor(100 * (1 - 0.5 * cpu_left / 128000 - 0.5 * gpu_left / 8000)).astype(np.int64)


class FGD:
    """FGD as published (the 0..100 score), with the workload learned online: the in-run
    baseline of the default policy (capacity.FragAware). Pure when choosing; `learn()`
    counts a request that really arrived."""

    name = "fgd"

    def __init__(self, coverage: float = 0.95, quantize: bool = True, scale: float = 1000.0) -> None:
        self.target = TargetWorkload(coverage)
        self.quantize, self.scale = quantize, scale
        rnd = np.random.default_rng(12345)
        self._hash_w = rnd.integers(1, 2**61, size=64, dtype=np.int64)

    def learn(self, req: Request) -> None:
        self.target.learn(req)

    def twin(self) -> FGD:
        """What this policy has learned, apart from this one: to choose with on another thread
        (the start estimates' replay) while this one goes on learning (arrays() caches)."""
        twin = copy.copy(self)
        twin.target = copy.deepcopy(self.target)
        return twin

    def choose(self, state: ClusterState, req: Request, rng: random.Random) -> Placement | None:
        idx = np.flatnonzero(state.feasible(req))
        if idx.size == 0:
            return None
        shapes = self.target.arrays(state.models)
        delta_node, gpu_value = self._deltas(state, idx, shapes, req)
        order = np.lexsort((state.rank[idx], self._key(delta_node)))
        best = int(order[0])
        i = int(idx[best])
        if req.num_gpu == 0:
            gpus: list[int] = []
        elif req.is_sharing:
            row = state.gpu_free[i]
            gpus = [int(np.flatnonzero(row == gpu_value[best])[0])]
        else:
            gpus = [int(g) for g in np.flatnonzero(state.gpu_free[i] == MILLI_PER_GPU)[: req.num_gpu]]
        return state.placement_on(i, req, gpus)

    def _key(self, delta: np.ndarray) -> np.ndarray:
        """Lower is better. Quantized like a Kubernetes score (0..100): placements that differ
        by little count as equal and go by the tie order, which keeps pods from piling onto
        the few nodes that are marginally best and packs better on the whole trace."""
        if not self.quantize:
            return np.round(delta, 6)
        with np.errstate(over="ignore", invalid="ignore"):
            return np.where(
                np.isinf(delta), np.inf, -np.floor(100 / (1 + np.exp(np.clip(delta / self.scale, -50, 50))))
            )

    def _deltas(self, state: ClusterState, idx: np.ndarray, shapes: ShapeArrays, req: Request):
        """Per feasible node: the least rise in fragmentation over its GPU choices, and for a
        sharing request the free milli of the GPU that achieves it."""
        rows = np.sort(state.gpu_free[idx], axis=1)
        cpu_before = state.cpu_free[idx]
        cpu_after = cpu_before - req.cpu_milli
        # CPU matters only through thresholds: bucket it so equal nodes collapse
        b_before = np.searchsorted(shapes.cpu_cuts, cpu_before, side="right")
        b_after = np.searchsorted(shapes.cpu_cuts, cpu_after, side="right")
        model = state.model_id[idx]
        key = np.concatenate([rows, np.stack([b_before, b_after, model], axis=1)], axis=1)
        h = (key * self._hash_w[: key.shape[1]]).sum(axis=1)
        _, first, inverse = np.unique(h, return_index=True, return_inverse=True)

        r = rows[first]
        cut_before = _cut_value(shapes.cpu_cuts, b_before[first])
        cut_after = _cut_value(shapes.cpu_cuts, b_after[first])
        m = model[first]
        idle, hfrag, can, full, top = _node_terms(shapes, r, cut_before, m)
        f_before = _frag(shapes, idle, hfrag, can)

        if req.num_gpu == 0:
            can_a = _can_host(shapes, cut_after, m, full, top)
            d = _frag(shapes, idle, hfrag, can_a) - f_before
            return d[inverse], np.zeros(idx.size)
        if not req.is_sharing:
            k = req.num_gpu
            full_a = full - k
            partial_top = np.where(r < MILLI_PER_GPU, r, -1).max(axis=1)
            top_a = np.where(full_a > 0, MILLI_PER_GPU, np.maximum(partial_top, 0))
            can_a = _can_host(shapes, cut_after, m, full_a, top_a)
            d = _frag(shapes, idle - k * MILLI_PER_GPU, hfrag, can_a) - f_before
            return d[inverse], np.zeros(idx.size)

        # sharing: try each GPU position w of the sorted row (value f -> f - milli)
        milli = req.gpu_milli
        f = r  # (D, W)
        fa = f - milli
        valid = f >= milli
        need = shapes.need[None, None, :]
        h_a = (
            hfrag[:, None, :]
            - np.where((f >= 0)[..., None] & (f[..., None] < need), f[..., None], 0)
            + np.where(fa[..., None] < need, fa[..., None], 0)
        )
        w_last = r.shape[1] - 1
        other_top = np.where(
            np.arange(r.shape[1])[None, :] == w_last,
            r[:, w_last - 1][:, None] if w_last >= 1 else -1,
            r[:, w_last][:, None],
        )
        top_a = np.maximum(other_top, fa)
        full_a = full[:, None] - (f == MILLI_PER_GPU)
        D, W = f.shape
        can_a = _can_host(
            shapes, np.repeat(cut_after, W), np.repeat(m, W), full_a.reshape(-1), top_a.reshape(-1)
        ).reshape(D, W, -1)
        d = _frag(shapes, np.broadcast_to((idle - milli)[:, None], (D, W)), h_a, can_a) - f_before[:, None]
        # invalid choices never win; among equal deltas prefer the tightest GPU (smallest f)
        d = np.where(valid, d, np.inf)
        best_w = _argmin_then_smallest(d, np.where(valid, f, np.iinfo(np.int64).max))
        rows_idx = np.arange(D)
        return d[rows_idx, best_w][inverse], f[rows_idx, best_w][inverse]


def _argmin_then_smallest(d: np.ndarray, f: np.ndarray) -> np.ndarray:
    """Column of the least d per row; among equal d, the smallest f."""
    dr = np.round(d, 6)
    best = dr.min(axis=1, keepdims=True)
    return np.where(dr == best, f, np.iinfo(np.int64).max).argmin(axis=1)


def _cut_value(cuts: np.ndarray, bucket: np.ndarray) -> np.ndarray:
    """A CPU amount standing for a bucket: exactly meets the thresholds below it."""
    padded = np.concatenate([[-1], cuts])
    return padded[bucket]
