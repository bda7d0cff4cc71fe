"""The placement decision at a university's scale: 100,000 GPUs (12,500 nodes of 8), about 70 %
full of pods drawn from Alibaba's openb trace, then 300 more openb requests, each decided by
the default policy as the hub keeps it (incremental state: score caches by node version, the
NodeIndex, classes of alike nodes) and, on the same state, by a fresh scan that scores every
feasible node from scratch (what each decision would cost without that state). Both must
choose the same placement; the decision is timed in wall time and in CPU time of this thread
(the machine may be shared: its load inflates wall time, not CPU time).
"""

from __future__ import annotations

import random
import time

import numpy as np

from benchmarks.data import shared_data
from gpupool.pool import GPU, ClusterState, Inventory, Node, Request
from gpupool.pool.capacity import FragAware, FragModel
from gpupool.sim.traces import read_pods

FILL = 0.7
TRIES = 30


def cluster(gpus: int) -> Inventory:
    return Inventory(
        nodes=tuple(
            Node(
                name=f"n{i}",
                gpus=tuple(GPU(g, f"n{i}-{g}", "G2", 32768, True) for g in range(8)),
                cpu_milli=96_000,
                memory_mib=786_432,
            )
            for i in range(gpus // 8)
        )
    )


def filled(gpus: int, requests: list[Request], rng: random.Random, tries: int = TRIES) -> ClusterState:
    """Nodes taken one after another and filled with openb pods drawn at random, moving on after
    `tries` pods in a row did not fit (a packed cluster as best-fit leaves it, in seconds rather
    than the minutes best-fit takes at this size; tries=1 leaves every node's rest different),
    up to 70 % of the GPUs."""
    state = ClusterState(cluster(gpus))
    target = FILL * state.inventory.capacity_milli
    used, node, misses = 0, 0, 0
    while used < target and node < len(state.inventory.nodes):
        req = rng.choice(requests)
        if not fits(state, node, req):
            misses += 1
            if misses >= tries:
                node, misses = node + 1, 0
            continue
        misses = 0
        if req.is_sharing:
            free = state.gpu_free[node]
            gpus_ = [int(min(state.fitting_gpus(node, req), key=lambda g: (int(free[g]), g)))]
        else:
            gpus_ = state.fitting_gpus(node, req)[: req.num_gpu]
        state.apply(state.placement_on(node, req, gpus_))
        used += req.total_milli
    return state


def fits(state: ClusterState, i: int, req: Request) -> bool:
    """ClusterState.feasible for one node (without computing it for all of them)."""
    if (
        state.cpu_free[i] < req.cpu_milli
        or state.mem_free[i] < req.memory_mib
        or state.pods[i] >= state.max_pods[i]
    ):
        return False
    free = state.gpu_free[i]
    if req.num_gpu == 0:
        return True
    return bool((free >= req.gpu_milli).any()) if req.is_sharing else int((free == 1000).sum()) >= req.num_gpu


def scan(policy: FragAware, state: ClusterState, req: Request):
    """The decision without any kept state: every feasible node scored from the state alone."""
    idx = np.flatnonzero(state.feasible(req))
    if not len(idx):
        return None
    model = FragModel(state, policy._shapes, size_exponent=policy.SIZE_EXPONENT)
    after, gpu = model.best_after(state, idx, req)
    gain = after - model.usable(state, idx)
    pos = int(np.lexsort((state.rank[idx], -gain))[0])
    i = int(idx[pos])
    if req.is_sharing:
        return state.placement_on(i, req, [int(gpu[pos])])
    return state.placement_on(
        i, req, [int(g) for g in np.flatnonzero(state.gpu_free[i] == 1000)[: req.num_gpu]]
    )


def run(gpus: int = 100_000, decisions: int = 300, seed: int = 7) -> dict:
    pods = [
        p.request
        for p in read_pods(shared_data("openb", "openb_pod_list_default.csv"))
        if p.request.num_gpu <= 8
    ]
    rng = random.Random(seed)
    t0 = time.perf_counter()
    state = filled(gpus, pods, random.Random(gpus))
    fill_s = time.perf_counter() - t0
    requests = [rng.choice(pods) for _ in range(decisions + 100)]
    policy = FragAware()
    for req in requests[:100]:  # a realistic learned mix before the timed decisions
        policy.learn(req)
    out: dict = {
        "gpus": gpus,
        "fill_s": fill_s,
        "decisions": decisions,
        "ours_wall": [],
        "ours_cpu": [],
        "scan_wall": [],
        "scan_cpu": [],
        "different": 0,
    }
    for req in requests[100:]:
        # a decision: learning the request that arrived, then choosing (the hub does both per spawn)
        w, c = time.perf_counter(), time.thread_time()
        policy.learn(req)
        got = policy.choose(state, req, rng)
        out["ours_cpu"].append(time.thread_time() - c)
        out["ours_wall"].append(time.perf_counter() - w)
        w, c = time.perf_counter(), time.thread_time()
        fresh = scan(policy, state, req)
        out["scan_cpu"].append(time.thread_time() - c)
        out["scan_wall"].append(time.perf_counter() - w)
        out["different"] += got != fresh
        if got is not None:
            state.apply(got)
    return out


def p(values: list[float], q: float) -> float:
    return float(np.percentile(np.array(values) * 1000, q))


def report(r: dict) -> None:
    print(
        f"placement at {r['gpus']:,} GPUs ({r['gpus'] // 8:,} nodes, {FILL:.0%} full, filled in {r['fill_s']:.0f} s),"
        f" {r['decisions']} openb decisions, ms:"
    )
    print("| decision | wall p50 | wall p99 | CPU p50 | CPU p99 |")
    print("|---|---|---|---|---|")
    for key, label in (
        ("ours", "frag-aware with its kept state (the hub's)"),
        ("scan", "fresh scan of every node (baseline)"),
    ):
        print(
            f"| {label} | {p(r[key + '_wall'], 50):.2f} | {p(r[key + '_wall'], 99):.2f} | {p(r[key + '_cpu'], 50):.2f}"
            f" | {p(r[key + '_cpu'], 99):.2f} |"
        )
    print(f"decisions that differ from the fresh scan: {r['different']} of {r['decisions']}")
