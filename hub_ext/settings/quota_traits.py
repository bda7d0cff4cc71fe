"""The build quota options as trait types, one per structured option (the culler's
idle_culler/traits.py and jupyter-resource-usage do the same): each checks its value where
traitlets reads it — a config file, the chart's rendered config, the quota API — and names the
option and the bad value. The pure conversions to milli-GPU below are what the checks run, and
what GPUPool.quota_policy() builds the policy with."""

from __future__ import annotations

import re
from typing import Any

from traitlets import Dict, Float, Int, List, TraitError

from gpupool.pool import parse_gpus
from gpupool.pool.units import UnitError, shown

LIMIT_KEYS = frozenset({"quota", "fractions", "max_per_workspace", "max_workspaces", "pools"})
MAX_POOLS = 16  # node pools a workspace may be offered
MAX_SIZES = 64  # GPU sizes a form offers: a choice for people, not a table
MAX_WORKSPACES = 1000
# a group named in quotas: what JupyterHub and the usual authenticators name groups ("cs101",
# "physics-lab", GitHub's "org:team", "staff@uni.edu"), at most JupyterHub's 255 characters; a
# typo such as "cs 101!" would otherwise be kept as a group nobody is in
GROUP_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._@+:/-]{0,254}\Z")


def _where(obj: object, name: str | None) -> str:
    return f"{type(obj).__name__}.{name}"


# --- pure checks: a value -> milli-GPU (or names), TraitError naming `where` ------------------
def gpus_milli(value: object, where: str) -> int:
    """An amount of GPUs: not negative; above one GPU, whole GPUs only."""
    try:
        milli = parse_gpus(value)
    except UnitError as err:
        raise TraitError(f"{where}: {err}") from None
    if milli < 0:
        raise TraitError(f"{where}: must not be negative, got {shown(value)}")
    if milli > 1000 and milli % 1000:
        raise TraitError(f"{where}: {shown(value)} is more than one GPU but not a whole number")
    return milli


def sizes_milli(values: object, where: str) -> tuple[int, ...]:
    """GPU sizes offered on the form: each more than 0, each once, at most MAX_SIZES of them."""
    if not isinstance(values, list | tuple):
        raise TraitError(f"{where}: must be a list of GPU sizes, e.g. [0.25, 0.5, 1]; got {shown(values)}")
    if len(values) > MAX_SIZES:
        raise TraitError(f"{where}: at most {MAX_SIZES} GPU sizes, got {len(values)}")
    sizes = sorted(gpus_milli(v, where) for v in values)
    if sizes and sizes[0] == 0:
        raise TraitError(f"{where}: a GPU size must be more than 0, got {shown(list(values))}")
    twice = sorted({m for m in sizes if sizes.count(m) > 1})
    if twice:
        raise TraitError(f"{where}: each GPU size once; repeated: {[m / 1000 for m in twice]}")
    return tuple(sizes)


def workspace_count(value: object, where: str) -> int:
    """A number of workspaces: a whole number from 0 (none) to MAX_WORKSPACES."""
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_WORKSPACES:
        raise TraitError(f"{where}: must be a whole number from 0 to {MAX_WORKSPACES}, got {shown(value)}")
    return value


def pool_names(value: object, where: str) -> tuple[str, ...]:
    """Node pool names, in order of preference: at most MAX_POOLS, no repeats (the names are
    checked against c.TrainPool.node_pools when the hub starts)."""
    if (
        not isinstance(value, list | tuple)
        or len(value) > MAX_POOLS
        or not all(isinstance(v, str) and 0 < len(v) <= 63 for v in value)
        or len(set(value)) != len(value)
    ):
        raise TraitError(
            f"{where}: pools must be a list of at most {MAX_POOLS} node pool names,"
            f' each once, e.g. ["workstations", "dgx"]; got {shown(value)}'
        )
    return tuple(value)


def group_name(name: object, where: str) -> str:
    if not isinstance(name, str) or not GROUP_NAME.match(name):
        raise TraitError(
            f"{where}: a group name is 1 to 255 letters, digits or . _ @ + : / -,"
            f" starting with a letter or digit (no spaces); not {shown(name)}"
        )
    return name


def limits_problem(group: object, limits: object, where: str) -> None:
    """Raise on a bad group override: {quota, fractions, max_per_workspace, max_workspaces,
    pools}, each key checked as its default option is."""
    group_name(group, where)
    here = f"{where}[{group!r}]"
    if not isinstance(limits, dict):
        raise TraitError(f"{here} must be a dict, got {shown(limits)}")
    unknown = set(limits) - LIMIT_KEYS
    if unknown:
        raise TraitError(f"{here}: unknown keys {sorted(map(str, unknown))}; use {sorted(LIMIT_KEYS)}")
    for key in ("quota", "max_per_workspace"):
        if key in limits:
            gpus_milli(limits[key], here)
    if "fractions" in limits:
        sizes_milli(limits["fractions"], here)
    if "max_workspaces" in limits:
        workspace_count(limits["max_workspaces"], here)
    if "pools" in limits:
        pool_names(limits["pools"], here)


# --- the trait types ------------------------------------------------------------------------
class GPUs(Float[float, float]):
    """An amount of GPUs (a number): not negative, whole GPUs above one."""

    info_text = "an amount of GPUs"

    def validate(self, obj: object, value: object) -> float:
        where = _where(obj, self.name)
        gpus_milli(value, where)  # in plain words first ("not a GPU amount: 'lots'")
        if not isinstance(value, int | float):  # parse_gpus also reads "0.5": the option is a number
            raise TraitError(f"{where}: must be a number of GPUs, got {shown(value)}")
        return float(value)


class GPUSizes(List[float]):
    """The GPU sizes a spawn form offers: each more than 0, each once, whole GPUs above one."""

    info_text = "a list of GPU sizes"

    def __init__(self, default_value: list[float], **kwargs: Any) -> None:
        super().__init__(Float(), default_value=default_value, **kwargs)

    def validate(self, obj: object, value: Any) -> list[float]:
        sizes_milli(value, _where(obj, self.name))
        if not all(isinstance(v, int | float) for v in value):
            raise TraitError(f"{_where(obj, self.name)}: GPU sizes are numbers, got {shown(value)}")
        return [float(v) for v in value]


class WorkspaceCount(Int[int, int]):
    """A number of workspaces, 0 to MAX_WORKSPACES."""

    info_text = f"a whole number from 0 to {MAX_WORKSPACES}"

    def validate(self, obj: object, value: object) -> int:
        return workspace_count(value, _where(obj, self.name))


class PoolNames(List[str]):
    """Node pool names, in order of preference."""

    info_text = "a list of node pool names"

    def validate(self, obj: object, value: object) -> list[str]:
        return list(pool_names(value, _where(obj, self.name)))


class GroupTotals(Dict):
    """{group: GPUs}: what all members of a group hold together at most."""

    info_text = "a dict of {group: GPUs}"

    def validate(self, obj: object, value: Any) -> dict[str, Any]:
        value = super().validate(obj, value)
        where = _where(obj, self.name)
        for group, gpus in value.items():
            group_name(group, where)
            gpus_milli(gpus, f"{where}[{group!r}]")
        return value


class GroupLimits(Dict):
    """{group: {quota, fractions, max_per_workspace, max_workspaces, pools}}."""

    info_text = "a dict of {group: {limit: value}}"

    def validate(self, obj: object, value: Any) -> dict[str, object]:
        value = super().validate(obj, value)
        where = _where(obj, self.name)
        for group, limits in value.items():
            limits_problem(group, limits, where)
        return value
