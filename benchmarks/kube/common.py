"""What both scale runs share: a control plane with N kwok GPU nodes, percentiles, memory."""

from __future__ import annotations

import contextlib
import resource
import statistics
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
