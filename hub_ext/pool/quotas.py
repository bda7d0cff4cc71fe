"""Fixed build quotas: what a user may hold in workspaces, with per-group overrides.

A build quota is *fixed*: it is never exceeded, and build workspaces are never
preempted, so what a user holds stays theirs until they stop it or it is culled.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from gpupool.pool.errors import InvalidRequest, QuotaExceeded
from gpupool.pool.units import format_gpus


@dataclass(frozen=True)
class BuildLimits:
    quota_milli: int  # total a user may hold across their workspaces
    sizes_milli: tuple[int, ...]  # fraction sizes offered on the spawn form
    max_per_workspace_milli: int
    max_workspaces: int
    pools: tuple[str, ...] = ()  # node pools its workspaces may use, in order of preference (empty: any GPU)

    def merged(self, other: BuildLimits) -> BuildLimits:
        """The more generous of two limits, field by field (a user in several groups); pools:
        either's (in this one's order first), or every GPU when either allows every GPU."""
        pools = (
            ()
            if not self.pools or not other.pools
            else self.pools + tuple(p for p in other.pools if p not in self.pools)
        )
        return BuildLimits(
            quota_milli=max(self.quota_milli, other.quota_milli),
            sizes_milli=tuple(sorted(set(self.sizes_milli) | set(other.sizes_milli))),
            max_per_workspace_milli=max(self.max_per_workspace_milli, other.max_per_workspace_milli),
            max_workspaces=max(self.max_workspaces, other.max_workspaces),
            pools=pools,
        )


@dataclass(frozen=True)
class Holding:
    """A build workspace a user holds right now: on a GPU, or parked (its GPU given back until it
    resumes, and its share still counted against the quota)."""

    server_name: str
    milli: int
    parked: bool = False

    @property
    def label(self) -> str:
        name = f"server '{self.server_name}'" if self.server_name else "your default server"
        return f"{name} (parked)" if self.parked else name


@dataclass(frozen=True)
class BuildQuotaPolicy:
    default: BuildLimits
    group_overrides: Mapping[str, BuildLimits] = field(default_factory=dict)
    # optional ceiling on what all members of a group hold together (a class of 30 on 4 GPUs)
    group_totals_milli: Mapping[str, int] = field(default_factory=dict)

    def limits_for(self, groups: Iterable[str]) -> BuildLimits:
        overrides = [self.group_overrides[g] for g in sorted(set(groups)) if g in self.group_overrides]
        if not overrides:
            return self.default
        limits = overrides[0]
        for more in overrides[1:]:
            limits = limits.merged(more)
        return limits

    def offered_sizes(self, groups: Iterable[str], held: Iterable[Holding]) -> list[tuple[int, bool]]:
        """Every size the user's groups allow, each with whether it fits what is left now."""
        limits = self.limits_for(groups)
        left = limits.quota_milli - sum(h.milli for h in held)
        sizes = [s for s in limits.sizes_milli if s <= limits.max_per_workspace_milli]
        return [(s, s <= left) for s in sizes]

    def check(
        self,
        milli: int,
        groups: Iterable[str],
        held: Iterable[Holding],
        group_held_milli: Mapping[str, int] | None = None,
    ) -> None:
        """Raise with a message that says what to do, or return when `milli` is allowed."""
        groups = list(groups)
        held = list(held)
        limits = self.limits_for(groups)
        if milli not in limits.sizes_milli:
            offered = ", ".join(format_gpus(s) for s in limits.sizes_milli) or "none"
            raise InvalidRequest(f"{format_gpus(milli)} is not an offered size; choose one of: {offered}")
        if milli > limits.max_per_workspace_milli:
            raise InvalidRequest(
                f"one workspace may hold at most {format_gpus(limits.max_per_workspace_milli)};"
                f" choose a smaller size"
            )
        if len(held) >= limits.max_workspaces:
            names = ", ".join(h.label for h in held)
            raise QuotaExceeded(
                f"you may run {limits.max_workspaces} GPU workspace(s) at once and hold {names}:"
                f" stop one first"
            )
        used = sum(h.milli for h in held)
        if used + milli > limits.quota_milli:
            if held:
                holds = ", ".join(f"{h.label} holds {format_gpus(h.milli)}" for h in held)
                hint = (
                    "stop it or choose a smaller fraction"
                    if len(held) == 1
                    else ("stop one or choose a smaller fraction")
                )
                raise QuotaExceeded(
                    f"your build quota is {format_gpus(limits.quota_milli)} and {holds}: {hint}"
                )
            raise QuotaExceeded(
                f"your build quota is {format_gpus(limits.quota_milli)}: choose a smaller fraction"
            )
        for g in groups:
            total = self.group_totals_milli.get(g)
            if total is None:
                continue
            in_use = (group_held_milli or {}).get(g, 0)
            if in_use + milli > total:
                raise QuotaExceeded(
                    f"group '{g}' may hold {format_gpus(total)} in all and its members hold"
                    f" {format_gpus(in_use)} now: choose a smaller fraction or try again later"
                )
