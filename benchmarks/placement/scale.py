"""Placement decision latency at 1k, 10k and 100k GPUs with a realistic fill.

Clusters of 8-GPU nodes are filled to about 70 % of GPU with pods drawn from the openb
default trace (best-fit, quickly), then the same 300 further requests are timed for each
policy on a copy of that state. Cost per decision should grow no worse than linearly.
"""

from __future__ import annotations

import copy
import random
import statistics
import time

import numpy as np

from benchmarks.data import shared_data
from gpupool.pool import GPU, ClusterState, Inventory, Node, get_policy
from gpupool.sim.traces import read_pods

SIZES = [1_000, 10_000, 100_000]
POLICIES = ["frag-aware", "best-fit"]


def cluster(gpus: int) -> Inventory:
    nodes = tuple(
        Node(
            name=f"n{i}",
            gpus=tuple(GPU(g, f"n{i}-{g}", "G2", 32768, True) for g in range(8)),
            cpu_milli=96_000,
            memory_mib=786_432,
        )
        for i in range(gpus // 8)
    )
    return Inventory(nodes=nodes)


def filled(gpus: int, pods, rng: random.Random) -> ClusterState:
    state = ClusterState(cluster(gpus))
    filler = get_policy("best-fit")
    target = 0.7 * state.inventory.capacity_milli
    while state.used_milli() < target:
        req = rng.choice(pods).request
        placement = filler.choose(state, req, rng)
        if placement is not None:
            state.apply(placement)
    return state


def latencies(state: ClusterState, policy: str, requests, seed: int) -> list[float]:
    state = copy.deepcopy(state)
    chooser = get_policy(policy)
    rng = random.Random(seed)
    # let a learning policy see a realistic mix before it is timed
    for req in requests[:100]:
        chooser.learn(req)
    out = []
    for req in requests[100:]:
        chooser.learn(req)
        t0 = time.perf_counter()
        placement = chooser.choose(state, req, rng)
        out.append(time.perf_counter() - t0)
        if placement is not None:
            state.apply(placement)
    return out


def scale_table() -> str:
    pods = [
        p for p in read_pods(shared_data("openb", "openb_pod_list_default.csv")) if p.request.num_gpu <= 8
    ]
    rng = random.Random(7)
    requests = [rng.choice(pods).request for _ in range(400)]
    lines = [
        "placement decision latency, ms (300 decisions on a ~70 % full cluster of 8-GPU nodes)",
        "| GPUs | nodes | "
        + " | ".join(f"{p} p50 | {p} p99" for p in POLICIES)
        + " | frag-aware / best-fit (p50) |",
        "|---|---|" + "---|---|" * len(POLICIES) + "---|",
    ]
    for gpus in SIZES:
        state = filled(gpus, pods, random.Random(gpus))
        cells, p50 = [], {}
        for policy in POLICIES:
            ms = np.array(latencies(state, policy, requests, 1)) * 1000
            p50[policy] = statistics.median(ms)
            cells.append(f"{p50[policy]:.2f} | {np.percentile(ms, 99):.2f}")
        lines.append(
            f"| {gpus:,} | {gpus // 8:,} | "
            + " | ".join(cells)
            + f" | {p50['frag-aware'] / p50['best-fit']:.2f} |"
        )
    return "\n".join(lines)
