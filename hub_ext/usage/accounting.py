"""Where the GPU-hours go: pure arithmetic over what was held, used and parked. No I/O, no clock.

Units are integers: a share is milli-GPU (1000 = one GPU), time is whole seconds, so a GPU-hour
is 3,600,000 milli-GPU x seconds (`MILLI_S_PER_GPU_HOUR`); money is integer micro-units of the
admin's currency. Only the figures shown to people are turned into floats, at the edge.

Inputs (built by `gpupool.usage.ledger` from the event log and the store):
* `Held`: one allocation interval of a workload (a build workspace's session, a train job's
  run), with what it is counted under (owner, groups, project, node pool, GPU model);
* `Parked`: a workspace's parked interval (its share given back, its claim kept);
* `UseRow`: the culler's utilization samples of one session in one hour, summed;
* `JobEvent`: a train job's first start (with its wait), failure or preemption.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from gpupool.vocab import states
from gpupool.vocab.kinds import WorkloadKind

MILLI_S_PER_GPU_HOUR = 1000 * 3600
DIMENSIONS = ("user", "group", "project", "pool", "model", "kind")
NO_GROUP = "(no group)"
BUILD = "(build workspaces)"  # the project of a build workspace: none
ANY_POOL = "(no pool)"


@dataclass(frozen=True)
class Held:
    kind: WorkloadKind  # BUILD or TRAIN
    owner: str
    name: str  # server name or job id
    milli: int
    start: int  # epoch seconds
    end: int | None  # None: still held
    groups: tuple[str, ...] = ()
    project: str = ""
    pools: tuple[str, ...] = ()  # node pools its GPUs belong to
    model: str = ""

    def seconds_in(self, a: int, b: int, now: int) -> int:
        """Seconds of [a, b) it was held (an open interval counts until `now`)."""
        end = now if self.end is None else self.end
        return max(0, min(b, end) - max(a, self.start))

    def keys(self, by: str) -> tuple[str, ...]:
        """What it is counted under in dimension `by` (an allocation of a user in two groups
        counts in both groups; shares of a group table do not add up to the total)."""
        if by == "user":
            return (self.owner,)
        if by == "group":
            return self.groups or (NO_GROUP,)
        if by == "project":
            return (self.project or BUILD,)
        if by == "pool":
            return self.pools or (ANY_POOL,)
        if by == "model":
            return (self.model or "?",)
        if by == "kind":
            return (self.kind,)
        raise ValueError(f"unknown dimension {by!r}; use one of {', '.join(DIMENSIONS)}")


@dataclass(frozen=True)
class Parked:
    owner: str
    name: str
    milli: int
    start: int
    end: int | None
    groups: tuple[str, ...] = ()

    def seconds_in(self, a: int, b: int, now: int) -> int:
        end = now if self.end is None else self.end
        return max(0, min(b, end) - max(a, self.start))


@dataclass(frozen=True)
class UseRow:
    """Samples of one session (kind, owner, name, since) in the hour starting at `hour * 3600`."""

    hour: int
    kind: str
    owner: str
    name: str
    since: int
    milli: int
    measured_milli_s: int
    used_milli_s: int
    peak_memory_mib: int
    share_memory_mib: int


@dataclass(frozen=True)
class JobEvent:
    kind: states.JobEvent  # START (a first run) | FAIL | PREEMPT
    job: str
    owner: str
    project: str
    time: int
    wait_s: int = 0  # for a first start: seconds since it was submitted


@dataclass
class Totals:
    allocated: int = 0  # milli-GPU x seconds held
    measured: int = 0  # of which with GPU use data
    used: int = 0  # milli-GPU x seconds the GPU was busy (within `measured`)
    parked: int = 0  # milli-GPU x seconds parked (a share given back, its claim kept)
    parked_s: int = 0  # seconds parked
    cost: int = 0  # micro-units of money
    jobs_run: int = 0
    jobs_failed: int = 0
    jobs_preempted: int = 0
    peak_memory_mib: int = 0
    share_memory_mib: int = 0  # the largest share's memory seen with a peak

    @property
    def waste(self) -> int:
        """Allocated but idle, where measured (time without GPU data is not called waste)."""
        return max(0, self.measured - self.used)

    def add(self, other: Totals) -> None:
        for name in (
            "allocated",
            "measured",
            "used",
            "parked",
            "parked_s",
            "cost",
            "jobs_run",
            "jobs_failed",
            "jobs_preempted",
        ):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        self.peak_memory_mib = max(self.peak_memory_mib, other.peak_memory_mib)
        self.share_memory_mib = max(self.share_memory_mib, other.share_memory_mib)


@dataclass(frozen=True)
class Prices:
    """Price of a GPU-hour in micro-units, per node pool or GPU model (a pool's price wins),
    else `default`."""

    default: int = 0
    by_pool: dict[str, int] = field(default_factory=dict)
    by_model: dict[str, int] = field(default_factory=dict)

    def per_gpu_hour(self, h: Held) -> int:
        for p in h.pools:
            if p in self.by_pool:
                return self.by_pool[p]
        return self.by_model.get(h.model, self.default)


def cost(milli_s: int, micro_per_gpu_hour: int) -> int:
    return milli_s * micro_per_gpu_hour // MILLI_S_PER_GPU_HOUR


def session_key(kind: str, owner: str, name: str, since: int) -> tuple[str, str, str, int]:
    return (kind, owner, name, since)


def totals(
    held: Iterable[Held],
    a: int,
    b: int,
    now: int,
    by: str,
    uses: Iterable[UseRow] = (),
    parked: Iterable[Parked] = (),
    jobs: Iterable[JobEvent] = (),
    prices: Prices = Prices(),
    groups_of: Callable[[str], tuple[str, ...]] | None = None,
) -> dict[str, Totals]:
    """Totals per key of dimension `by` over [a, b). `uses` are counted by the hour they fall in
    (hours starting in [a, b)) and attributed through the session they belong to; `groups_of`
    gives the groups of an owner for records that carry none (train jobs, parked shares)."""
    out: dict[str, Totals] = {}
    sessions: dict[tuple[str, str, str, int], Held] = {}

    def at(key: str) -> Totals:
        return out.setdefault(key, Totals())

    def with_groups(h: Held) -> Held:
        if by == "group" and not h.groups and groups_of is not None:
            from dataclasses import replace

            return replace(h, groups=groups_of(h.owner))
        return h

    for h in held:
        h = with_groups(h)
        sessions[session_key(h.kind, h.owner, h.name, h.start)] = h
        s = h.seconds_in(a, b, now)
        if not s:
            continue
        milli_s = h.milli * s
        for k in h.keys(by):
            t = at(k)
            t.allocated += milli_s
            t.cost += cost(milli_s, prices.per_gpu_hour(h))
    for u in uses:
        if not a <= u.hour * 3600 < b:
            continue
        session = sessions.get(session_key(u.kind, u.owner, u.name, u.since))
        if session is None:  # its allocation is outside the records read: count it under what the row says
            session = with_groups(Held(WorkloadKind(u.kind), u.owner, u.name, u.milli, u.since, u.since))
        for k in session.keys(by):
            t = at(k)
            t.measured += u.measured_milli_s
            t.used += min(u.used_milli_s, u.measured_milli_s)
            if u.peak_memory_mib:
                t.peak_memory_mib = max(t.peak_memory_mib, u.peak_memory_mib)
                t.share_memory_mib = max(t.share_memory_mib, u.share_memory_mib)
    for p in parked:
        s = p.seconds_in(a, b, now)
        if not s:
            continue
        h = with_groups(
            Held(WorkloadKind.BUILD, p.owner, p.name, p.milli, p.start, p.end, p.groups, "", (), "")
        )
        for k in h.keys(by) if by not in ("pool", "model") else (ANY_POOL if by == "pool" else "?",):
            t = at(k)
            t.parked += p.milli * s
            t.parked_s += s
    for j in jobs:
        if not a <= j.time < b:
            continue
        h = with_groups(Held(WorkloadKind.TRAIN, j.owner, j.job, 0, j.time, j.time, (), j.project))
        for k in h.keys(by) if by not in ("pool", "model") else (ANY_POOL if by == "pool" else "?",):
            t = at(k)
            if j.kind == states.JobEvent.START:
                t.jobs_run += 1
            elif j.kind == states.JobEvent.FAIL:
                t.jobs_failed += 1
            elif j.kind == states.JobEvent.PREEMPT:
                t.jobs_preempted += 1
    return out


def series(
    held: Iterable[Held],
    a: int,
    b: int,
    step: int,
    now: int,
    by: str,
    groups_of: Callable[[str], tuple[str, ...]] | None = None,
) -> dict[str, list[int]]:
    """Allocated milli-GPU x seconds per key in each bucket [a + i*step, a + (i+1)*step) — the
    stacked plot. Buckets are whole seconds; the last one may end after `b` (clipped)."""
    n = max(1, math.ceil((b - a) / step))
    out: dict[str, list[int]] = {}
    for h in held:
        if by == "group" and not h.groups and groups_of is not None:
            from dataclasses import replace

            h = replace(h, groups=groups_of(h.owner))
        end = now if h.end is None else h.end
        lo, hi = max(a, h.start), min(b, end)
        if hi <= lo:
            continue
        first, last = (lo - a) // step, (hi - 1 - a) // step
        for k in h.keys(by):
            row = out.setdefault(k, [0] * n)
            for i in range(first, min(last, n - 1) + 1):
                s0, s1 = a + i * step, min(b, a + (i + 1) * step)
                row[i] += h.milli * max(0, min(hi, s1) - max(lo, s0))
    return out


def percentile(values: Sequence[int], q: float) -> int | None:
    """The nearest-rank percentile (q in 0..100) of whole numbers; None for none."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[rank - 1]


def waits(jobs: Iterable[JobEvent], a: int, b: int) -> dict[str, dict[str, int | None]]:
    """Per project: how long jobs that first started in [a, b) waited (p50, p95, count)."""
    by_project: dict[str, list[int]] = {}
    for j in jobs:
        if j.kind == states.JobEvent.START and a <= j.time < b:
            by_project.setdefault(j.project, []).append(max(0, j.wait_s))
    return {
        p: {"p50_s": percentile(w, 50), "p95_s": percentile(w, 95), "jobs": len(w)}
        for p, w in sorted(by_project.items())
    }


def sessions(held: Iterable[Held], uses: Iterable[UseRow]) -> list[Session]:
    """Each build session with its peak GPU memory against its share (for over-requesters and
    right-sizing): only sessions with GPU memory data."""
    peaks: dict[tuple[str, str, str, int], UseRow] = {}
    measured: dict[tuple[str, str, str, int], int] = {}
    for u in uses:
        key = session_key(u.kind, u.owner, u.name, u.since)
        measured[key] = measured.get(key, 0) + u.measured_milli_s
        best = peaks.get(key)
        if best is None or u.peak_memory_mib > best.peak_memory_mib:
            peaks[key] = u
    out = []
    for h in held:
        key = session_key(h.kind, h.owner, h.name, h.start)
        top = peaks.get(key)
        if h.kind != WorkloadKind.BUILD or top is None or not top.share_memory_mib:
            continue
        out.append(
            Session(
                h.owner,
                h.name,
                h.milli,
                h.start,
                h.end,
                top.peak_memory_mib,
                top.share_memory_mib,
                measured.get(key, 0),
            )
        )
    return sorted(out, key=lambda s: (s.owner, s.start))


@dataclass(frozen=True)
class Session:
    owner: str
    name: str
    milli: int
    start: int
    end: int | None
    peak_memory_mib: int
    share_memory_mib: int
    measured_milli_s: int


def over_requesters(
    sess: Iterable[Session], held: Iterable[Held], a: int, b: int, now: int, limit: int = 10
) -> list[dict[str, object]]:
    """Users whose peak GPU memory stayed far under their share: the lowest peak/share first,
    among those who held the most (GPU-hours held in [a, b) break ties)."""
    held_by: dict[str, int] = {}
    for h in held:
        if h.kind == WorkloadKind.BUILD:
            held_by[h.owner] = held_by.get(h.owner, 0) + h.milli * h.seconds_in(a, b, now)
    peak: dict[str, tuple[int, int, int]] = {}  # owner -> (peak MiB, share MiB, sessions)
    for s in sess:
        if s.end is not None and s.end <= a or s.start >= b:
            continue
        p, sh, n = peak.get(s.owner, (0, 0, 0))
        peak[s.owner] = (max(p, s.peak_memory_mib), max(sh, s.share_memory_mib), n + 1)
    rows: list[dict[str, Any]] = []
    for owner, (p, sh, n) in peak.items():
        rows.append(
            {
                "user": owner,
                "peak_memory_mib": p,
                "share_memory_mib": sh,
                "sessions": n,
                "peak_pct": round(100 * p / sh) if sh else None,
                "allocated_gpu_hours": gpu_hours(held_by.get(owner, 0)),
            }
        )
    rows.sort(
        key=lambda r: (
            r["peak_pct"] if r["peak_pct"] is not None else 999,
            -r["allocated_gpu_hours"],
            r["user"],
        )
    )
    return rows[:limit]


def gpu_hours(milli_s: int) -> float:
    """For people: GPU-hours, rounded to 1/1000."""
    return round(milli_s / MILLI_S_PER_GPU_HOUR, 3)
