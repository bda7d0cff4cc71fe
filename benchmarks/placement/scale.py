"""Placement decision latency at 1k, 10k and 100k GPUs with a realistic fill.

Two kinds of cluster: *homogeneous*, 8-GPU nodes of one model (the best case for the
default policy's cache of alike nodes), and *openb*, the openb GPU nodes (seven models, 1 to 8
GPUs a node, their own CPU and memory) repeated until the size is reached. Each is filled to
about 70 % of GPU with pods drawn from the openb default trace (best-fit, 10,000 GPUs at a
time), then the same 300 further requests are timed for each policy on a copy of that state,
wall and CPU (the CPU time of the deciding thread: what the machine's other work does not inflate).
Cost per decision should grow no worse than linearly.
"""

from __future__ import annotations

import copy
import dataclasses
import random
import statistics
import time

import numpy as np

from benchmarks.data import shared_data
from gpupool.pool import GPU, ClusterState, Inventory, Node, get_policy
from gpupool.sim.traces import read_nodes, read_pods

SIZES = [1_000, 10_000, 100_000]
POLICIES = ["frag-aware", "best-fit"]
CLUSTERS = ["homogeneous", "openb"]
LATENCY_TARGET_MS = 5.0  # p99 of one decision at 100,000 GPUs (#26)


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


def openb_cluster(gpus: int) -> Inventory:
    """openb's GPU nodes, in file order, repeated (renamed) until there are `gpus` GPUs."""
    base = read_nodes(shared_data("openb", "openb_node_list_gpu_node.csv")).nodes
    nodes: list[Node] = []
    total = 0
    while total < gpus:
        node = base[len(nodes) % len(base)]
        name = f"{node.name}-{len(nodes) // len(base)}"
        gpus_of = tuple(dataclasses.replace(g, uuid=f"{name}-{g.index}") for g in node.gpus)
        nodes.append(dataclasses.replace(node, name=name, gpus=gpus_of))
        total += len(gpus_of)
    return Inventory(nodes=tuple(nodes))


FILL_CHUNK_GPUS = 10_000  # best-fit fills at most this many GPUs at a time


def filled(inventory: Inventory, pods, rng: random.Random) -> ClusterState:
    """`inventory` about 70 % full of GPU, by best-fit, in consecutive chunks of nodes with up to
    FILL_CHUNK_GPUS GPUs each (one chunk up to 10,000 GPUs: the whole cluster). Filling 100,000 GPUs
    in one piece costs each pod a scan of every node, over ten minutes of CPU; a chunk's
    placements are the ones best-fit makes on that chunk alone, then applied to the whole."""
    state = ClusterState(inventory)
    nodes, start = inventory.nodes, 0
    while start < len(nodes):
        end, gpus = start, 0
        while end < len(nodes) and (gpus == 0 or gpus + len(nodes[end].gpus) <= FILL_CHUNK_GPUS):
            gpus += len(nodes[end].gpus)
            end += 1
        for placement in _fill(Inventory(nodes=nodes[start:end]), pods, rng):
            state.apply(placement)
        start = end
    return state


def _fill(inventory: Inventory, pods, rng: random.Random) -> list:
    state = ClusterState(inventory)
    filler = get_policy("best-fit")
    target = 0.7 * state.inventory.capacity_milli
    misses = 0
    out = []
    while state.used_milli() < target:
        req = rng.choice(pods).request
        placement = filler.choose(state, req, rng)
        if placement is not None:
            state.apply(placement)
            out.append(placement)
        else:
            misses += 1
            if misses > 100_000:  # a cluster whose CPU runs out before its GPUs: stop, do not spin
                raise RuntimeError(f"cannot fill {len(inventory.nodes)} nodes to 70 % of GPU")
    return out


def latencies(state: ClusterState, policy: str, requests, seed: int) -> tuple[list[float], list[float]]:
    """Wall and CPU seconds of each timed decision."""
    state = copy.deepcopy(state)
    chooser = get_policy(policy)
    rng = random.Random(seed)
    # let a learning policy see a realistic mix before it is timed
    for req in requests[:100]:
        chooser.learn(req)
    wall, cpu = [], []
    for req in requests[100:]:
        chooser.learn(req)
        c0, t0 = time.thread_time(), time.perf_counter()
        placement = chooser.choose(state, req, rng)
        wall.append(time.perf_counter() - t0)
        cpu.append(time.thread_time() - c0)
        if placement is not None:
            state.apply(placement)
    return wall, cpu


def scale_run(sizes: list[int] = SIZES, clusters: list[str] = CLUSTERS) -> dict:
    """Latencies per (cluster, GPUs, policy), both kinds of cluster and both policies in one run."""
    pods = [
        p for p in read_pods(shared_data("openb", "openb_pod_list_default.csv")) if p.request.num_gpu <= 8
    ]
    rng = random.Random(7)
    requests = [rng.choice(pods).request for _ in range(400)]
    out: dict = {"sizes": sizes, "clusters": clusters, "nodes": {}}
    for key in ("p50_ms", "p99_ms", "p50_cpu_ms", "p99_cpu_ms"):
        out[key] = {}
    for kind in clusters:
        for gpus in sizes:
            inventory = cluster(gpus) if kind == "homogeneous" else openb_cluster(gpus)
            out["nodes"][(kind, gpus)] = len(inventory.nodes)
            state = filled(inventory, pods, random.Random(gpus))
            for policy in POLICIES:
                wall, cpu = latencies(state, policy, requests, 1)
                at = (kind, gpus, policy)
                out["p50_ms"][at], out["p99_ms"][at] = _p50_p99(wall)
                out["p50_cpu_ms"][at], out["p99_cpu_ms"][at] = _p50_p99(cpu)
    return out


def _p50_p99(seconds: list[float]) -> tuple[float, float]:
    ms = np.array(seconds) * 1000
    return float(statistics.median(ms)), float(np.percentile(ms, 99))


def scale_table(run: dict | None = None) -> str:
    run = run or scale_run()
    lines = [
        "placement decision latency, ms (300 decisions on a ~70 % full cluster; homogeneous: 8-GPU nodes of"
        " one model; openb: openb's GPU nodes, seven models, repeated), wall p50 / p99 and CPU p50 / p99",
        "| cluster | GPUs | nodes | "
        + " | ".join(f"{p} wall p50 / p99 | {p} CPU p50 / p99" for p in POLICIES)
        + " | frag-aware / best-fit (CPU p50) |",
        "|---|---|---|" + "---|---|" * len(POLICIES) + "---|",
    ]
    for kind in run["clusters"]:
        for gpus in run["sizes"]:
            cells = []
            for policy in POLICIES:
                at = (kind, gpus, policy)
                cells.append(
                    f"{run['p50_ms'][at]:.2f} / {run['p99_ms'][at]:.2f}"
                    f" | {run['p50_cpu_ms'][at]:.2f} / {run['p99_cpu_ms'][at]:.2f}"
                )
            ratio = (
                run["p50_cpu_ms"][(kind, gpus, "frag-aware")] / run["p50_cpu_ms"][(kind, gpus, "best-fit")]
            )
            lines.append(
                f"| {kind} | {gpus:,} | {run['nodes'][(kind, gpus)]:,} | "
                + " | ".join(cells)
                + f" | {ratio:.2f} |"
            )
    return "\n".join(lines)
