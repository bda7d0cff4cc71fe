"""When a workspace is warned and culled: pure code, time is an argument.

Signals per workspace: GPU use (sampled in windows, like Run:ai: a window is idle when use
stayed below the threshold the whole window; any use resets the idle time) and Jupyter
activity (the hub's last_activity). With fresh GPU data a workspace is idle once its GPU
has idled `idle_limit_s` and Jupyter has been quiet `jupyter_idle_s` (short: the GPU data
already confirms nobody computes), and a GPU idle for `gpu_idle_hard_s` is taken back even
from someone still typing. Without GPU data, Jupyter activity alone decides, with the
longer limit idle_limit_s + jupyter_idle_s, as in jupyterhub-idle-culler. Limits: idle-GPU time, maximum session age and an
optional end-of-workday cut-off. A warning comes `warn_before_s` before any cull; a user
may extend once. Fail-safe: without fresh GPU data nobody is culled for GPU idleness —
the decision falls back to Jupyter activity.

Parking (`park_after_s` > 0) comes between warning and stopping: a GPU idle that long is
parked — the kernels' GPU memory moves to host memory, the share goes back to the pool and
the session stays open — instead of being stopped by the GPU-idle rules. A parked workspace
holds no GPU, so only the time limits (and, if set, `parked_stop_s` of Jupyter silence) end
it; when parking fails the GPU-idle rules apply as before.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field, replace
from typing import Any
from zoneinfo import ZoneInfo

from gpupool.vocab.culling import IDLE_UTIL_PCT, BudgetAction, CullAction, CullReason, gpu_idle
from gpupool.vocab.reason_words import PRESENT


@dataclass(frozen=True)
class Limits:
    # the shipped defaults, chosen on benchmarks/culling (docs/culling.md#defaults): 72.5 % of the GPU
    # time held used, 0.1 % of sessions falsely culled, no running cell stopped
    idle_limit_s: float = 900.0  # GPU idle this long, and Jupyter idle jupyter_idle_s -> cull
    jupyter_idle_s: float = 600.0
    gpu_idle_hard_s: float = 8 * 3600.0  # GPU idle this long -> cull even if Jupyter is busy (0: off)
    max_age_s: float = 0.0  # any session longer -> cull (0: no maximum)
    busy_grace_s: float = 6 * 3600.0  # a GPU busy at a time limit keeps the session this much longer at most
    workday_end: str = ""  # "19:00": sessions end at this local time (empty: off)
    timezone: str = "UTC"
    warn_before_s: float = 900.0
    extension_s: float = 7200.0  # granted once per session on request
    util_threshold_pct: float = IDLE_UTIL_PCT  # below this the GPU counts as idle (gpu_idle)
    window_s: float = 30.0
    stale_after_s: float = 180.0  # GPU data older than this is missing data
    memory_resolver: str = "warn"  # warn | restart-kernel | stop
    memory_grace_s: float = 300.0  # over its memory share this long -> resolver acts
    park_after_s: float = 0.0  # GPU idle this long -> park (0: never park)
    parked_stop_s: float = 0.0  # parked and Jupyter quiet this long -> stop (0: only time limits)
    hibernate: bool = False  # a stop first saves each kernel's variables; they come back at the next start
    hibernate_max_gib: float = 8.0  # a session's saved state over this: stopped as before, with the reason


@dataclass
class IdleTracker:
    """Idle time of one workspace from GPU samples, counted in whole windows."""

    window_s: float
    threshold_pct: float
    idle_s: float = 0.0
    window_start: float | None = None
    window_busy: bool = False
    last_sample: float | None = None

    def add(self, now: float, util_pct: float) -> None:
        if self.window_start is None:
            self.window_start = now
        while now - self.window_start >= self.window_s:  # close the windows that ended
            if not self.window_busy:
                self.idle_s += self.window_s
            self.window_start += self.window_s
            self.window_busy = False
        if not gpu_idle(util_pct, self.threshold_pct):
            self.window_busy = True
            self.idle_s = 0.0  # any use resets
        self.last_sample = now

    def fresh(self, now: float, stale_after_s: float) -> bool:
        return self.last_sample is not None and now - self.last_sample <= stale_after_s


@dataclass(frozen=True)
class Workspace:
    owner: str
    name: str
    started: float  # epoch seconds
    last_activity: float | None  # the hub's, epoch seconds
    gpu_idle_s: float | None  # None: no fresh GPU data
    memory_mib: int = 0
    memory_limit_mib: int = 0
    memory_over_since: float | None = None
    extended: bool = False
    exempt: bool = False
    parked: bool = False  # its GPU is parked: it holds no share now
    park_failed: bool = False  # the last park did not work: the GPU-idle rules stop it instead
    budget: BudgetAction = (
        BudgetAction.NONE
    )  # its owner is over a GPU-hour budget: park or stop its GPU once idle


@dataclass(frozen=True)
class Decision:
    action: CullAction
    reason: CullReason = CullReason.NONE
    cull_at: float | None = None  # when the earliest limit ends the session
    message: str = ""


def workday_cutoff(started: float, limits: Limits) -> float | None:
    """The first end of the workday after the session started, as epoch seconds."""
    if not limits.workday_end:
        return None
    hour, minute = (int(x) for x in limits.workday_end.split(":"))
    tz = ZoneInfo(limits.timezone)
    start = dt.datetime.fromtimestamp(started, tz)
    cut = start.replace(hour=hour, minute=minute, second=0, microsecond=0)
    if cut <= start:
        cut += dt.timedelta(days=1)
    return cut.timestamp()


TIME_LIMITS = (CullReason.MAX_AGE, CullReason.WORKDAY_END)


def time_limits(started: float, extended: bool, limits: Limits) -> dict[CullReason, float]:
    """The session's own time limits (maximum length, end of the workday), known from its start."""
    bonus = limits.extension_s if extended else 0.0
    out = {CullReason.MAX_AGE: started + limits.max_age_s + bonus} if limits.max_age_s else {}
    cut = workday_cutoff(started, limits)
    if cut is not None:
        out[CullReason.WORKDAY_END] = cut + bonus
    return out


def session_end(started: float, extended: bool, limits: Limits) -> tuple[CullReason, float] | None:
    """(reason, epoch seconds): when the session ends at the latest, whatever the user does;
    pages show it from the spawn on, before the culler's first pass judges the idle rules.
    None: no time limit (neither a maximum length nor an end of the workday)."""
    return min(time_limits(started, extended, limits).items(), key=lambda kv: kv[1], default=None)


def deadlines(ws: Workspace, now: float, limits: Limits) -> dict[CullReason, float]:
    """Every limit that applies, as the time it ends the session."""
    bonus = limits.extension_s if ws.extended else 0.0
    out = time_limits(ws.started, ws.extended, limits)
    if limits.busy_grace_s and ws.gpu_idle_s is not None and ws.gpu_idle_s < limits.window_s:
        # the GPU is running something: a time limit waits for it to end (up to busy_grace_s)
        # rather than kill a training run; missing GPU data gets no such grace
        for reason in TIME_LIMITS:
            if reason in out and out[reason] <= now:
                out[reason] = min(now + limits.window_s, out[reason] + limits.busy_grace_s)
    last = ws.last_activity if ws.last_activity is not None else ws.started
    if ws.parked:
        # no GPU held: nothing to reclaim for idleness, only the session's own limits
        if limits.parked_stop_s:
            out[CullReason.PARKED_IDLE] = last + limits.parked_stop_s + bonus
        return out
    if parks(ws, limits) and ws.gpu_idle_s is not None:  # parks() checked the GPU data too
        # the GPU-idle rules end in a park, not a stop
        out[CullReason.PARK] = now - ws.gpu_idle_s + limits.park_after_s
    elif ws.gpu_idle_s is not None:
        gpu_idle_since = now - ws.gpu_idle_s
        # GPU data confirms the idleness, so a short Jupyter silence is enough ...
        out[CullReason.IDLE_GPU] = (
            max(gpu_idle_since + limits.idle_limit_s, last + limits.jupyter_idle_s) + bonus
        )
        if limits.gpu_idle_hard_s:
            # ... and a GPU idle for hours is taken back even from someone still typing
            out[CullReason.IDLE_GPU_LONG] = gpu_idle_since + limits.gpu_idle_hard_s + bonus
    else:
        # fail-safe: no fresh GPU data -> only Jupyter activity can make it idle
        out[CullReason.IDLE_JUPYTER] = last + limits.idle_limit_s + limits.jupyter_idle_s + bonus
    return out


def parks(ws: Workspace, limits: Limits) -> bool:
    """Parking replaces the GPU-idle stop for this workspace (needs fresh GPU data)."""
    return bool(limits.park_after_s) and ws.gpu_idle_s is not None and not ws.park_failed and not ws.parked


PARKED = "GPU parked — it comes back when you run a cell"


def decide(ws: Workspace, now: float, limits: Limits) -> Decision:
    if ws.exempt:
        return Decision(CullAction.KEEP, message="exempt from culling")
    if ws.memory_limit_mib and ws.memory_mib > ws.memory_limit_mib:
        over_for = now - (ws.memory_over_since if ws.memory_over_since is not None else now)
        msg = (
            f"uses {ws.memory_mib} MiB of GPU memory, more than its share of {ws.memory_limit_mib} MiB:"
            f" free memory or stop it and ask for a bigger fraction"
        )
        if over_for >= limits.memory_grace_s and limits.memory_resolver != "warn":
            return Decision(CullAction.RESOLVE_MEMORY, CullReason.MEMORY, now, msg)
        return Decision(CullAction.WARN, CullReason.MEMORY, None, msg)
    over = over_budget(ws, limits)
    if over is not None:
        return over
    ends = deadlines(ws, now, limits)
    park_at = ends.pop(CullReason.PARK, None)
    if not ends:  # nothing ends this session: parked, or parking in place of the idle stop, and no time limit
        if park_at is not None and park_at <= now:
            return Decision(CullAction.PARK, CullReason.IDLE_GPU, None, PARKED)
        return Decision(CullAction.KEEP, CullReason.NONE, None, PARKED if ws.parked else "")
    reason, cull_at = min(ends.items(), key=lambda kv: kv[1])
    if park_at is not None and park_at <= now and cull_at > now:
        return Decision(CullAction.PARK, CullReason.IDLE_GPU, cull_at, PARKED)
    left = cull_at - now
    if left <= 0:
        return Decision(CullAction.CULL, reason, cull_at, f"stopped because {PRESENT[reason]}")
    if reason in TIME_LIMITS and deadlines(ws, now, replace(limits, busy_grace_s=0))[reason] <= now:
        return Decision(
            CullAction.WARN,
            reason,
            cull_at,
            f"{PRESENT[reason]}: it stops as soon as its GPU work ends; save your work",
        )
    if reason in (CullReason.IDLE_GPU, CullReason.IDLE_GPU_LONG) and (ws.gpu_idle_s or 0.0) < limits.window_s:
        # a busy GPU is not warned "its GPU has been idle", even where the warning time is as long
        # as the idle limit (the defaults: 15 min each); it is warned once it has been idle a window
        return Decision(CullAction.KEEP, reason, cull_at, PARKED if ws.parked else "")
    if left <= limits.warn_before_s:
        hint = "" if ws.extended else " (you may extend once)"
        return Decision(
            CullAction.WARN,
            reason,
            cull_at,
            f"will stop in {int(left // 60)} min because {PRESENT[reason]}: save your work{hint}",
        )
    return Decision(CullAction.KEEP, reason, cull_at, PARKED if ws.parked else "")


def idle_for(ws: Workspace, now: float, reason: CullReason) -> float | None:
    """How long the workspace had been idle, as the rule that ended it counts idleness: what the
    "Server not running" page says it was stopped after. None for a rule that is not idleness."""
    quiet = now - (ws.last_activity if ws.last_activity is not None else ws.started)
    if reason == CullReason.IDLE_GPU and ws.gpu_idle_s is not None:
        return min(ws.gpu_idle_s, quiet)  # both: the GPU idle and nobody in Jupyter
    if reason == CullReason.IDLE_GPU_LONG and ws.gpu_idle_s is not None:
        return ws.gpu_idle_s
    if reason in (CullReason.IDLE_JUPYTER, CullReason.PARKED_IDLE):
        return quiet
    return None


def extended_end(ws: Workspace, now: float, limits: Limits) -> float | None:
    """When the session would end were its one extension granted now, by the same rules and the
    same readings as `decide`: the hub shows it the moment the user presses Extend, not the
    unextended end nor a guess from the time limits alone until the next pass. None: already
    extended, exempt, or nothing would end it."""
    if ws.extended or ws.exempt:
        return None
    return decide(replace(ws, extended=True), now, limits).cull_at


BUDGET = "the GPU-hour budget is used up: its idle GPU was given back"


def over_budget(ws: Workspace, limits: Limits) -> Decision | None:
    """A user over a GPU-hour budget (gpupool.usage) keeps every running cell, but an idle GPU is
    taken back at the first pass that sees it idle for a whole window: parked, or (where
    parking is off and the hub says so) stopped. Only with fresh GPU data: without it nobody
    can tell a running cell from an idle one."""
    if not ws.budget or ws.parked or ws.gpu_idle_s is None or ws.gpu_idle_s < limits.window_s:
        return None
    if ws.budget == BudgetAction.PARK and not ws.park_failed:
        return Decision(CullAction.PARK, CullReason.BUDGET, None, BUDGET)
    if ws.budget == BudgetAction.STOP:
        return Decision(
            CullAction.CULL,
            CullReason.BUDGET,
            None,
            "stopped because the GPU-hour budget is used up and its GPU is idle",
        )
    return None


@dataclass(frozen=True)
class CullerPolicy:
    """Limits per workload type with overrides per group and per profile (most specific wins:
    profile over group over default; among several groups the most generous value of each limit)."""

    default: Limits = field(default_factory=Limits)
    groups: dict[str, dict[str, Any]] = field(default_factory=dict[str, Any])
    profiles: dict[str, dict[str, Any]] = field(default_factory=dict[str, Any])
    exempt_users: frozenset[str] = frozenset()

    def limits_for(self, groups: list[str], profile: str = "") -> Limits:
        limits = self.default
        matching = [self.groups[g] for g in sorted(groups) if g in self.groups]
        if matching:
            merged: dict[str, Any] = {}
            for over in matching:
                for key, value in over.items():
                    merged[key] = value if key not in merged else most_generous(key, merged[key], value)
            workday = [
                o for o in matching if o.get("workday_end") == merged.get("workday_end") and "timezone" in o
            ]
            if merged.get("workday_end") and workday:  # a clock time means something in its own time zone
                merged["timezone"] = workday[0]["timezone"]
            limits = replace(limits, **merged)
        if profile in self.profiles:
            limits = replace(limits, **self.profiles[profile])
        return limits


NEVER_AT_ZERO = frozenset(
    {"gpu_idle_hard_s", "max_age_s", "park_after_s", "parked_stop_s"}
)  # 0: this rule never acts
GENTLEST_FIRST = ("warn", "restart-kernel", "stop")


def most_generous(key: str, a: Any, b: object) -> object:
    """Of two groups' values of one limit, the one kinder to the user (docs/culling.md)."""
    if key in NEVER_AT_ZERO and 0 in (a, b):
        return 0
    if key == "memory_resolver":
        return min(a, b, key=GENTLEST_FIRST.index)
    if key == "hibernate":  # keeping the variables is the kinder
        return bool(a or b)
    if key == "hibernate_max_gib":
        return max(a, b)
    if key == "util_threshold_pct":  # below it a GPU counts as idle: lower keeps more GPUs busy
        return min(a, b)
    if key == "workday_end":  # "" (none) beats any clock time, else the later one
        return "" if not a or not b else max(a, b, key=lambda hm: tuple(int(x) for x in hm.split(":")))
    if key.endswith("_s"):
        return max(a, b)
    return b  # timezone: the last group's, unless it goes with the chosen workday_end (above)
