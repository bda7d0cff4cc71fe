"""GPU-hour budgets over a rolling window: pure rules, no I/O, no clock (`now` is an argument).

A budget never stops running work. It decides three things only:
* `state`: how much of a user's budget is used (fraction-weighted GPU-hours of their build
  workspaces and train jobs in the last `window_s`), and whether that is near or over it;
* `admits`: whether a new spawn or train job may start (over budget: only a spawn of at most
  the rule's minimum share);
* `frees_at`: when the window has slid far enough for the budget to have room again, if
  nothing more is held (what the refusal tells the user).
Everything running keeps running; the culler parks idle GPUs of users over budget (see
gpupool.idle_culler.policy, reason "budget").
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from gpupool.pool.units import format_gpu_hours, format_gpus
from gpupool.usage.accounting import MILLI_S_PER_GPU_HOUR, Held
from gpupool.vocab.kinds import WorkloadKind

USER = "user:"
GROUP = "group:"


@dataclass(frozen=True)
class Rule:
    """A budget: `limit_milli_s` in `window_s`, for a user (`target` "user:ann") or a group
    ("group:students"; each member alone, or the members together when `shared`)."""

    target: str
    limit_milli_s: int
    window_s: int
    warn_pct: int = 80  # warn at this share of the budget
    min_share_milli: int = 0  # over budget, a spawn of at most this size still starts
    shared: bool = False

    @property
    def gpu_hours(self) -> float:
        return self.limit_milli_s / MILLI_S_PER_GPU_HOUR

    def describe(self) -> str:
        days = self.window_s / 86400
        window = "week" if days == 7 else ("day" if days == 1 else f"{days:g} days")
        who = self.target.removeprefix(USER).removeprefix(GROUP)
        whose = (
            f"user {who}"
            if self.target.startswith(USER)
            else (f"group {who} together" if self.shared else f"each member of group {who}")
        )
        return f"{format_gpu_hours(self.limit_milli_s)} GPU-h per {window} ({whose})"


@dataclass(frozen=True)
class Grant:
    target: str  # "user:ann" | "group:students"
    kind: str  # topup | exempt
    milli_s: int
    until: int


@dataclass(frozen=True)
class State:
    rule: Rule
    used_milli_s: int
    limit_milli_s: int  # the rule's, plus top-ups in force
    status: str  # ok | near | over | exempt
    frees_at: int | None = None  # over: when the window has room again if nothing more is held

    @property
    def used_pct(self) -> int:
        return 100 * self.used_milli_s // self.limit_milli_s if self.limit_milli_s else 100

    def message(self, clock=None) -> str:
        used, limit = format_gpu_hours(self.used_milli_s), format_gpu_hours(self.limit_milli_s)
        what = self.rule.describe()
        if self.status == "exempt":
            return f"exempt from the GPU-hour budget ({what})"
        head = f"{used} of {limit} GPU-h used ({self.used_pct} %) of the budget {what}"
        if self.status == "near":
            return f"{head}: near the limit; over it, new workspaces and train jobs are refused"
        if self.status == "over":
            when = f" until {clock(self.frees_at)}" if clock and self.frees_at else ""
            small = (
                f" except workspaces of at most {format_gpus(self.rule.min_share_milli)}"
                if self.rule.min_share_milli
                else ""
            )
            return (
                f"{head}: the budget is used up; new workspaces{small} and train jobs are refused{when};"
                " running work keeps running, idle GPUs are parked. Ask an admin for a top-up"
            )
        return head


def rules_for(rules: Sequence[Rule], owner: str, groups: Iterable[str]) -> list[Rule]:
    """The rules that apply to `owner`: their own rule if there is one, else the most generous
    per-member rule of their groups (by GPU-h per day); plus every shared rule of their groups."""
    groups = set(groups)
    own = [r for r in rules if r.target == USER + owner]
    member = [
        r
        for r in rules
        if r.target.startswith(GROUP) and not r.shared and r.target.removeprefix(GROUP) in groups
    ]
    shared = [
        r for r in rules if r.target.startswith(GROUP) and r.shared and r.target.removeprefix(GROUP) in groups
    ]
    if own:
        personal = own[:1]
    elif member:
        personal = [max(member, key=lambda r: (r.limit_milli_s / r.window_s, r.target))]
    else:
        personal = []
    return personal + shared


def used(held: Iterable[Held], window_s: int, now: int) -> int:
    """Fraction-weighted milli-GPU x seconds held in (now - window_s, now]."""
    return sum(h.milli * h.seconds_in(now - window_s, now, now) for h in held)


def in_force(grants: Iterable[Grant], target: str, now: int) -> tuple[bool, int]:
    """(exempt, extra milli-GPU x seconds) granted to `target` at `now`."""
    exempt, extra = False, 0
    for g in grants:
        if g.target != target or g.until <= now:
            continue
        if g.kind == "exempt":
            exempt = True
        elif g.kind == "topup":
            extra += g.milli_s
    return exempt, extra


def state(rule: Rule, held: Sequence[Held], grants: Iterable[Grant], now: int, owner: str = "") -> State:
    """`held`: the allocations the rule counts (the user's own; for a shared rule, the group
    members'). Top-ups and exemptions of the user and of the rule's group both apply."""
    grants = list(grants)
    targets = {rule.target} | ({USER + owner} if owner else set())
    exempt, extra = False, 0
    for t in targets:
        e, x = in_force(grants, t, now)
        exempt, extra = exempt or e, extra + x
    limit = rule.limit_milli_s + extra
    spent = used(held, rule.window_s, now)
    if exempt:
        return State(rule, spent, limit, "exempt")
    if spent >= limit:
        return State(rule, spent, limit, "over", frees_at(held, rule.window_s, limit, now))
    if spent * 100 >= limit * rule.warn_pct:
        return State(rule, spent, limit, "near")
    return State(rule, spent, limit, "ok")


def frees_at(held: Sequence[Held], window_s: int, limit: int, now: int) -> int:
    """The first time t >= now at which what was held in (t - window_s, now] is below `limit`,
    if nothing is held after now: the window slides past old use. Usage falls monotonically
    in t, so a binary search over whole seconds finds it."""

    def spent(t: int) -> int:
        return sum(h.milli * h.seconds_in(t - window_s, now, now) for h in held)

    lo, hi = now, now + window_s  # at now + window_s nothing of the past is left
    if spent(lo) < limit:
        return lo
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if spent(mid) < limit:
            hi = mid
        else:
            lo = mid
    return hi


def admits(states: Iterable[State], milli: int, kind: WorkloadKind) -> State | None:
    """The state that refuses a new `kind` (a build of `milli`, or a train job) workload, or None.
    Over budget, a build workspace of at most the rule's minimum share still starts."""
    for s in states:
        if s.status != "over":
            continue
        if kind == WorkloadKind.BUILD and milli <= s.rule.min_share_milli:
            continue
        return s
    return None


def worst(states: Sequence[State]) -> State | None:
    """The state to show a user: over before near before ok (exempt: only if nothing else)."""
    order = {"over": 0, "near": 1, "ok": 2, "exempt": 3}
    return min(states, key=lambda s: (order[s.status], -s.used_pct), default=None)
