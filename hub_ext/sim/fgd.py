"""The FGD paper's evaluation protocol, step by step as its authors' simulator does it.

1. the GPU nodes only; 2. every trace pod once, shuffled with the seed, then pods drawn
with replacement until the requested GPU would pass `inflation` x capacity; 3. pods are
placed one at a time and never leave (a pod that fits nowhere fails); 4. after every
pod, arrived = requested milli-GPU so far (failed pods too) and allocated = milli-GPU
held; the value at level L% is the mean allocated/capacity over the pods whose arrived
level rounds to L.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable

from gpupool.pool import ClusterState, Inventory, get_policy
from gpupool.sim.traces import TracePod


def workload(pods: list[TracePod], capacity: int, inflation: float, rng: random.Random) -> list[TracePod]:
    order = list(pods)
    rng.shuffle(order)
    total = sum(p.request.total_milli for p in order)
    while True:
        pod = pods[rng.randrange(len(pods))]
        if total + pod.request.total_milli > inflation * capacity:
            return order
        order.append(pod)
        total += pod.request.total_milli


def run(
    inventory: Inventory,
    pods: list[TracePod],
    policy: str,
    seed: int,
    inflation: float = 1.3,
    progress: Callable[[int, int], None] | None = None,
) -> dict[str, object]:
    t0, c0 = time.perf_counter(), time.process_time()
    rng = random.Random(seed)
    capacity = inventory.capacity_milli
    order = workload(pods, capacity, inflation, rng)
    state = ClusterState(inventory)
    state.shuffle_ties(rng)
    chooser = get_policy(policy)
    arrived = allocated = failed = 0
    sums: dict[int, float] = {}
    counts: dict[int, int] = {}
    for n, pod in enumerate(order):
        req = pod.request
        arrived += req.total_milli
        chooser.learn(req)  # an arrival: the only thing a policy learns from
        placement = chooser.choose(state, req, rng)
        if placement is None:
            failed += 1
        else:
            state.apply(placement)
            allocated += placement.total_milli
        level = round(100 * arrived / capacity)
        sums[level] = sums.get(level, 0.0) + allocated / capacity
        counts[level] = counts.get(level, 0) + 1
        if progress is not None and n % 256 == 0:
            progress(n, len(order))
    levels = sorted(sums)
    ratio = allocated / capacity
    return {
        "policy": policy,
        "seed": seed,
        "inflation": inflation,
        "pods": len(order),
        "failed_pods": failed,
        "arrived_pct": levels,
        "alloc_ratio_pct": [round(100 * sums[lv] / counts[lv], 4) for lv in levels],
        "unallocated_gpus": round(inventory.gpu_count * (1 - ratio), 2),
        "wall_s": round(time.perf_counter() - t0, 3),
        "cpu_s": round(
            time.process_time() - c0, 3
        ),  # this process only: steadier than wall on a busy machine
    }
