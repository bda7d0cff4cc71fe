"""The pool core: pure Python, no I/O, no clock. The hub, spawners, runners and the
simulator all call this same code, so benchmarks measure the real policy."""

from .errors import InvalidRequest, NoCapacity, PoolError, QuotaExceeded
from .inventory import GPU, Inventory, Node, virtual_inventory
from .placement import get_policy
from .quotas import BuildLimits, BuildQuotaPolicy, Holding
from .request import Placement, Request
from .state import ClusterState
from .units import MILLI_PER_GPU, format_gpus, parse_gpus

__all__ = [
    "GPU", "MILLI_PER_GPU", "BuildLimits", "BuildQuotaPolicy", "ClusterState", "Holding",
    "InvalidRequest", "Inventory", "NoCapacity", "Node", "Placement", "PoolError",
    "QuotaExceeded", "Request", "format_gpus", "get_policy", "parse_gpus", "virtual_inventory",
]
