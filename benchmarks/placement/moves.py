"""The FGD protocol with moves: a pod that fits nowhere may have idle sharing pods moved.

Everything is the protocol of `gpupool.sim.fgd` (same order of pods, same seeds, same policy),
except that when a pod fits nowhere, gpupool's move action (`gpupool.pool.actions.move`) may
move up to `cap` sharing pods (one GPU, less than 1000 milli) — make-before-break, each onto a
GPU of its own model with its CPU and memory — so that it fits. A sharing pod is movable only
when it is idle at that moment, which it is with the probability `p_idle` that the Adobe
notebook sessions give (`idle_probability`): the share of a session's open time its GPU has
been idle for at least `after_s` (the culler's samplers call a GPU idle after a window of no
use). Pods that are not sharing never move (whole-GPU and multi-GPU pods are training).
"""

from __future__ import annotations

import random
import time

import numpy as np

from benchmarks.culling.sessions import make_sessions
from gpupool.pool import ClusterState, Inventory, get_policy
from gpupool.pool.actions.move import Movable, MoveRules, plan_moves
from gpupool.sim.fgd import workload
from gpupool.sim.traces import TracePod

CAP = 4  # moves per arrival at most (c.GPUMover.max_moves's default)


def idle_probability(after_s: float = 120.0, sessions: int = 2000, seed: int = 1) -> float:
    """The chance that an open notebook's GPU has been idle at least `after_s` at a random
    moment of its life: the Adobe sessions' gaps between cells, less their first `after_s`,
    and the time after the last cell, over their lifetimes."""
    idle = life = 0.0
    for s in make_sessions(sessions, seed):
        life += s.lifetime_s
        last = 0.0
        for a, b in s.cells:
            idle += max(0.0, a - last - after_s)
            last = b
        idle += max(0.0, s.lifetime_s - last - after_s)
    return idle / life


def run(
    inventory: Inventory,
    pods: list[TracePod],
    policy: str,
    seed: int,
    p_idle: float,
    cap: int,
    inflation: float = 1.3,
) -> dict:
    """`gpupool.sim.fgd.run` with moves for pods that fit nowhere; also counts the moves."""
    t0, c0 = time.perf_counter(), time.process_time()
    rng = random.Random(seed)
    capacity = inventory.capacity_milli
    order = workload(pods, capacity, inflation, rng)
    state = ClusterState(inventory)
    state.shuffle_ties(rng)
    chooser = get_policy(policy)
    # the mover's own copy of the policy, taught the same arrivals: trying destinations on
    # scratch copies of the pool must not throw away the chooser's per-node caches of `state`
    planner = get_policy(policy)
    coins = np.random.default_rng(
        seed
    )  # who is idle at each try: its own stream, the order stays the protocol's
    rules = MoveRules(rest_s=0.0, per_hour=10**9, max_moves=cap)
    models = {n.name: n.model for n in inventory.nodes}
    sharing: dict[str, Movable] = {}  # placed sharing pods, by a unique id
    arrived = allocated = failed = moves = placed = rescued = 0
    sums: dict[int, float] = {}
    counts: dict[int, int] = {}
    for n, pod in enumerate(order):
        req = pod.request
        arrived += req.total_milli
        chooser.learn(req)
        planner.learn(req)
        placement = chooser.choose(state, req, rng)
        if placement is None and req.num_gpu and sharing:
            pool = list(sharing.values())
            idle = coins.random(len(pool)) < p_idle
            plan = plan_moves(
                state, req, [w for w, i in zip(pool, idle, strict=True) if i], 0.0, rules, planner, rng
            )
            if plan is not None and plan.steps:
                for step in plan.steps:  # make-before-break: the destination first
                    state.apply(step.dest)
                    state.release(step.source)
                    w = sharing[step.id]
                    sharing[step.id] = Movable(w.id, step.dest, models[step.dest.node], True)
                moves += len(plan.steps)
                rescued += 1
                placement = plan.target
        if placement is None:
            failed += 1
        else:
            state.apply(placement)
            allocated += placement.total_milli
            placed += 1
            if req.is_sharing:
                sharing[f"{n}"] = Movable(f"{n}", placement, models[placement.node], True)
        level = round(100 * arrived / capacity)
        sums[level] = sums.get(level, 0.0) + allocated / capacity
        counts[level] = counts.get(level, 0) + 1
    levels = sorted(sums)
    return {
        "policy": policy,
        "seed": seed,
        "inflation": inflation,
        "pods": len(order),
        "failed_pods": failed,
        "arrived_pct": levels,
        "alloc_ratio_pct": [round(100 * sums[lv] / counts[lv], 4) for lv in levels],
        "moves": moves,
        "rescued": rescued,
        "placed": placed,
        "p_idle": p_idle,
        "cap": cap,
        "wall_s": round(time.perf_counter() - t0, 3),
        "cpu_s": round(time.process_time() - c0, 3),
    }


_INVENTORY: Inventory | None = None


def _one(task: tuple[str, list[TracePod], int, float, int]) -> tuple[str, int, dict]:
    global _INVENTORY
    label, pods, seed, p_idle, cap = task
    if _INVENTORY is None:
        from benchmarks.data import shared_data
        from gpupool.sim.traces import read_nodes

        _INVENTORY = read_nodes(shared_data("openb", "openb_node_list_gpu_node.csv"))
    from gpupool.pool.placement import DEFAULT_POLICY

    return label, seed, run(_INVENTORY, pods, DEFAULT_POLICY, seed, p_idle, cap)


def run_all(
    loads: list, seeds: list[int], p_idle: float, cap: int = CAP, jobs: int = 1
) -> dict[str, list[dict]]:
    """The protocol with moves for every workload (benchmarks.placement.robustness.Workload) and seed."""
    from concurrent.futures import ProcessPoolExecutor

    tasks = [(w.label, w.pods, s, p_idle, cap) for w in loads for s in seeds]
    out: dict[str, list[dict]] = {}
    if jobs > 1:
        with ProcessPoolExecutor(jobs) as pool:
            results = list(pool.map(_one, tasks, chunksize=1))
    else:
        results = [_one(t) for t in tasks]
    for label, _, result in results:
        out.setdefault(label, []).append(result)
    return out


def table(rows: list, moved: dict[str, list[dict]], published: dict[str, float], level: int = 130) -> str:
    """Per shared variant: FGD's published mean, our placement without moves (same run), with moves,
    and how many moves it took."""
    from statistics import mean

    from benchmarks.placement.robustness import _alloc_at
    from gpupool.pool.placement import DEFAULT_POLICY

    head = (
        "| workload | published FGD | ours, no moves | ours + moves | gain | moves per 100 placements"
        " | pods placed thanks to moves |"
    )
    lines = [head, "|---|---|---|---|---|---|---|"]
    for r in rows:
        results = moved.get(r.workload.label)
        if not results:
            continue
        with_moves = mean(_alloc_at(x, level) for x in results)
        per100 = 100 * sum(x["moves"] for x in results) / sum(x["placed"] for x in results)
        rescued = mean(x["rescued"] for x in results)
        pub = published.get(r.workload.label)
        lines.append(
            f"| {r.workload.label} | {f'{pub:.2f}' if pub is not None else ''} |"
            f" {r.alloc[DEFAULT_POLICY]:.2f} | {with_moves:.2f} | {with_moves - r.alloc[DEFAULT_POLICY]:+.2f} |"
            f" {per100:.2f} | {rescued:.1f} |"
        )
    return "\n".join(lines)
