"""The pool core: pure Python, no I/O, no clock. The hub, spawners, runners and the
simulator all call this same code, so benchmarks measure the real policy."""

from gpupool.pool.errors import InvalidRequest, NoCapacity, PoolError, QuotaExceeded
from gpupool.pool.inventory import GPU, Inventory, Node, virtual_inventory
from gpupool.pool.placement import get_policy
from gpupool.pool.quotas import BuildLimits, BuildQuotaPolicy, Holding
from gpupool.pool.request import Placement, Request
from gpupool.pool.state import ClusterState
from gpupool.pool.units import MILLI_PER_GPU, format_gpus, parse_gpus

__all__ = [
    "GPU",
    "MILLI_PER_GPU",
    "BuildLimits",
    "BuildQuotaPolicy",
    "ClusterState",
    "Holding",
    "InvalidRequest",
    "Inventory",
    "NoCapacity",
    "Node",
    "Placement",
    "PoolError",
    "QuotaExceeded",
    "Request",
    "format_gpus",
    "get_policy",
    "parse_gpus",
    "virtual_inventory",
]
