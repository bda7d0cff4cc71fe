"""The words of the culler's decisions (gpupool.idle_culler.policy), which travel in its report
to the hub (gpupool.api.culler) and on to the pages and the notebook widgets: what it does to a
workspace and why. String-valued enums, serialised as the same strings they always were.

Core, not the culler's own folder, because the hub and the widgets read them too (and neither may
import the culler); pure and stdlib-only.
"""

from __future__ import annotations

from enum import StrEnum
from typing import TypedDict

from gpupool.vocab.culler_wire import Finding

__all__ = [
    "IDLE_UTIL_PCT",
    "BudgetAction",
    "CullAction",
    "CullReason",
    "CullerState",
    "gpu_idle",
    "new_culler_state",
]

IDLE_UTIL_PCT = 1.0  # c.IdleCuller.util_threshold_pct's default


class CullerState(TypedDict):
    """The culler's last pass as the hub keeps it (gpupool.api.services): its findings per
    "owner/name" and when it ran; the pages, the widgets and the mover read it."""

    workspaces: dict[str, Finding]
    pass_time: float | None


def new_culler_state() -> CullerState:
    return {"workspaces": {}, "pass_time": None}


def gpu_idle(util_pct: float, threshold_pct: float) -> bool:
    """Whether one GPU reading counts as idle: strictly below the threshold
    (c.IdleCuller.util_threshold_pct), for workspaces and train jobs alike. A reading at the
    threshold is use; a threshold of 0 makes no reading idle."""
    return util_pct < threshold_pct


class CullAction(StrEnum):
    """What the policy decided for one workspace in one pass."""

    KEEP = "keep"
    WARN = "warn"
    PARK = "park"  # checkpoint its idle GPU and give the share to others
    CULL = "cull"  # stop it
    RESOLVE_MEMORY = "resolve-memory"  # over its memory share past the grace: the resolver acts


class CullReason(StrEnum):
    """Why: the limit that ends the session (or the rule that acts on it)."""

    NONE = ""
    IDLE_GPU = "idle-gpu"
    IDLE_GPU_LONG = "idle-gpu-long"
    IDLE_JUPYTER = "idle-jupyter"
    PARKED_IDLE = "parked-idle"
    MAX_AGE = "max-age"
    WORKDAY_END = "workday-end"
    MEMORY = "memory"
    BUDGET = "budget"  # its owner is over a GPU-hour budget
    RESTART_KERNEL = "restart-kernel"  # a memory event: its kernels were restarted
    PARK = "park"  # not a reason the policy gives: the key of the park time among the limits


class BudgetAction(StrEnum):
    """What the culler does with an idle GPU of a user over a GPU-hour budget (the hub says so in
    each target's `budget`, from gpupool.usage)."""

    NONE = ""  # not over budget, or nothing to do
    PARK = "park"
    STOP = "stop"
