"""Time-driven replay: pods arrive at their creation time and leave at their deletion time.

Reports time-averaged GPU allocation, fragmentation (idle milli on GPUs that are partly
used, the share nobody can use whole), queueing delay p50/p99 and rejections.
"""

from __future__ import annotations

import heapq
import random
import time
from collections import deque
from collections.abc import Callable

import numpy as np

from gpupool.pool import ClusterState, Inventory, Placement, get_policy
from gpupool.pool.units import MILLI_PER_GPU
from gpupool.sim.traces import TracePod


def _fragmented(state: ClusterState) -> int:
    free = state.gpu_free
    return int(np.where((free > 0) & (free < MILLI_PER_GPU), free, 0).sum())


def run(
    inventory: Inventory,
    pods: list[TracePod],
    policy: str,
    seed: int,
    queue: bool = False,
    progress: Callable[[int, int], None] | None = None,
) -> dict[str, object]:
    t0 = time.perf_counter()
    rng = random.Random(seed)
    # (created, lifetime, pod) of the pods with both times
    timed = [
        (p.created, p.deleted - p.created, p)
        for p in pods
        if p.created is not None and p.deleted is not None and p.deleted > p.created
    ]
    if not timed:
        raise ValueError("replay needs creation_time and deletion_time columns")
    state = ClusterState(inventory)
    state.shuffle_ties(rng)
    chooser = get_policy(policy)
    capacity = inventory.capacity_milli
    # (time, kind 0=leave 1=arrive, seq, payload: what leaves, or (lifetime, pod) that arrives)
    events: list[tuple[int, int, int, Placement | tuple[int, TracePod]]] = []
    for n, (created, life, p) in enumerate(sorted(timed, key=lambda t: (t[0], t[2].name))):
        heapq.heappush(events, (created, 1, n, (life, p)))
    waiting: deque[tuple[int, int, TracePod]] = deque()  # (arrived, lifetime, pod)
    delays: list[int] = []
    rejected = placed = 0
    alloc_area = frag_area = 0.0
    first_t = last_t = timed[0][0]  # the first pod of the trace, as read
    seq = len(timed)
    done = 0

    def try_place(pod: TracePod, life: int, now: int, arrived: int) -> bool:
        nonlocal placed, seq
        placement = chooser.choose(state, pod.request, rng)
        if placement is None:
            return False
        state.apply(placement)
        placed += 1
        delays.append(now - arrived)
        seq += 1
        heapq.heappush(events, (now + life, 0, seq, placement))
        return True

    while events:
        now, _, _, payload = heapq.heappop(events)
        used = state.used_milli()
        alloc_area += used * (now - last_t)
        frag_area += _fragmented(state) * (now - last_t)
        last_t = now
        if isinstance(payload, Placement):  # kind 0
            state.release(payload)
            while waiting and try_place(waiting[0][2], waiting[0][1], now, waiting[0][0]):
                waiting.popleft()
        else:
            done += 1
            life, pod = payload
            chooser.learn(pod.request)  # learned once per arrival, not per retry from the queue
            if not try_place(pod, life, now, now):
                if queue:
                    waiting.append((now, life, pod))
                else:
                    rejected += 1
            if progress is not None and done % 256 == 0:
                progress(done, len(timed))
    span = max(1, last_t - first_t)
    d = np.array(delays or [0])
    return {
        "policy": policy,
        "seed": seed,
        "pods": len(timed),
        "placed": placed,
        "rejected": rejected,
        "still_waiting": len(waiting),
        "time_avg_alloc_pct": round(100 * alloc_area / span / capacity, 3),
        "time_avg_fragmented_gpus": round(frag_area / span / MILLI_PER_GPU, 2),
        "queue_delay_p50_s": float(np.percentile(d, 50)),
        "queue_delay_p99_s": float(np.percentile(d, 99)),
        "wall_s": round(time.perf_counter() - t0, 3),
    }
