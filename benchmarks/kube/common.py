"""What both scale runs share: a control plane with N kwok GPU nodes, percentiles, memory."""

from __future__ import annotations

import contextlib
import gc
import resource
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import httpx

from tests.cluster import build
from tests.cluster.plane import ControlPlane
from tests.cluster.resources import Resources, gpu_node


def pct(values: list[float], q: int) -> float:
    if not values:
        return float("nan")
    return statistics.quantiles(values, n=100)[q - 1] if len(values) > 1 else values[0]


def rss_mib() -> float:
    """This process's resident memory now (VmRSS), MiB."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def held_mib(*roots: object, seen: set[int] | None = None) -> float:
    """What `roots` hold, MiB: sys.getsizeof over every dict, list, tuple, set, string and number
    reached from them, and the fields of dataclass-like objects (``__dict__``/``__slots__``), each
    counted once (also across calls that pass the same `seen`). Classes, modules and functions
    are not followed: what they hold is the program's, not the data's."""
    seen = set() if seen is None else seen
    total, stack = 0, list(roots)
    while stack:
        obj = stack.pop()
        if id(obj) in seen or isinstance(obj, type | type(sys) | type(held_mib)):
            continue
        seen.add(id(obj))
        total += sys.getsizeof(obj)
        if isinstance(obj, dict):
            stack.extend(obj.keys())
            stack.extend(obj.values())
        elif isinstance(obj, list | tuple | set | frozenset):
            stack.extend(obj)
        elif not isinstance(obj, str | bytes | int | float | bool) and obj is not None:
            if hasattr(obj, "__dict__"):
                stack.append(vars(obj))
            for slot in getattr(type(obj), "__slots__", ()):
                if hasattr(obj, slot):
                    stack.append(getattr(obj, slot))
    return total / 2**20


class GCClock:
    """CPU seconds this process has spent in Python's garbage collector since it was made (its
    `seconds`): part of each side's CPU per spawn, and the part that grows with everything else a
    process holds, not with what a spawn does."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self._started = 0.0
        gc.callbacks.append(self._tick)

    def _tick(self, phase: str, _info: dict) -> None:
        if phase == "start":
            self._started = time.process_time()
        else:
            self.seconds += time.process_time() - self._started


def peak_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


@contextlib.contextmanager
def plane_with_nodes(nodes: int) -> Iterator[ControlPlane]:
    plane = ControlPlane(Path(tempfile.mkdtemp(prefix="gpupool-bench-")), build.binaries())
    plane.start()
    try:
        with plane.client() as http:
            res = Resources(http)
            t0 = time.perf_counter()
            for i in range(nodes):
                for attempt in range(3):  # an apply is idempotent: a busy API server's timeout is retried
                    try:
                        res.apply(gpu_node(f"gpu-node-{i}"))
                        break
                    except httpx.TimeoutException:
                        if attempt == 2:
                            raise
            print(f"{nodes} kwok nodes x 8 GPUs created in {time.perf_counter() - t0:.1f} s", flush=True)
        yield plane
    finally:
        plane.stop()
