"""When will a train job waiting in KAI-Scheduler's queues start: a forecast of KAI's own order.

A pure function of a snapshot of the cluster (queues with their quota, limit, over-quota weight,
priority and min runtime; running jobs with their GPUs and start; pending jobs with their queue,
priority and GPUs; mean run times), replaying KAI's scheduling cycles forward in time, one at
each expected end of a running job and each time a running job passes its queue's min runtime:

- fair share per queue (KAI's proportion plugin): each queue first gets its quota (deserved),
  at most what it asks for (allocated + pending, capped at its limit); what is left goes to
  queues of the highest queue priority first, split by over-quota weight, up to what each asks;
  down the tree: departments' parent queues divide the cluster, then each its share among its
  projects' queues (a parent's limit holds its projects' jobs);
- allocate: queues are taken in KAI's queue order (under their fair share before those over
  it; a job that keeps its queue within its quota first; higher queue priority; the smaller
  share of its fair share), a queue's jobs by priority then age; a job that does not fit is
  passed over and the next is tried (KAI reserves nothing for it);
- reclaim: a job whose queue stays within its fair share takes GPUs from jobs that have run
  their queue's min runtime, each from a queue that, before that victim is taken, holds more
  than the larger of its quota and its fair share, or (for a job whose queue stays within its
  quota) more than its quota: KAI's two reclaim strategies (maintain fair share, guarantee
  deserved quota), which may leave the victim's queue below its fair share;
- preempt: a job takes GPUs from lower-priority jobs of its own queue past the min runtime.

With nodes in the snapshot a pod needs its GPUs on one node (milli-GPUs per node, not GPU by
GPU: fractions of two GPUs count as one's); without, GPUs are counted across the cluster. Node
pools (KAI's shards) would be forecast one at a time by the caller.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace

DEFAULT_RUNTIME_S = 3600.0  # a queue with no finished job yet: an hour each
HORIZON_S = 7 * 86400.0  # beyond this, "no start in sight"
MAX_CYCLES = 5000  # bounds the work on a huge snapshot
EPS = 1e-6


GO_UNITS = {"ns": 1e-9, "us": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}
GO_PART = re.compile(r"([0-9]{1,9}(?:\.[0-9]{1,9})?)(ns|us|ms|s|m|h)")


def go_duration(text: str) -> float:
    """Seconds of a Go duration as KAI's queues take it ("10m", "1h30m"); 0 for "" and for
    anything else (bounded: a value from configuration, never trusted to be well-formed)."""
    if not isinstance(text, str) or len(text) > 64 or not text:
        return 0.0
    parts = GO_PART.findall(text)
    if "".join(a + b for a, b in parts) != text:
        return 0.0
    return sum(float(a) * GO_UNITS[b] for a, b in parts)


@dataclass(frozen=True)
class KaiQueue:
    name: str
    deserved_milli: int  # the quota: always the queue's (reclaimed for it when lent)
    limit_milli: int = -1  # -1: none
    weight: float = 1.0  # overQuotaWeight: share of what is left beyond the quotas
    priority: int = 100  # the queue's priority: its over-quota share is served first
    min_runtime_s: float = 0.0  # preempt/reclaimMinRuntime: a job runs this long before it can be taken
    parent: str = ""  # its parent queue (a department's), one of KaiSnapshot.parents; "" none

    def cap(self) -> float:
        return float("inf") if self.limit_milli < 0 else float(self.limit_milli)


@dataclass(frozen=True)
class KaiJob:
    id: str
    queue: str
    milli: int  # GPUs x 1000
    priority: int = 0  # the pod's priority class: higher first in its queue, and may preempt lower
    submitted: float = 0.0
    started: float | None = None  # running jobs: when the current run started
    max_runtime_s: float = 0.0  # declared bound (0: none)
    preemptible: bool = True
    label: str = ""  # how the job is named in words ("job ab12 of vision"); its id otherwise
    # running jobs: (node, milli) of each pod where known; a waiting one: milli of each of its
    # pods (0: one pod holds it all; an elastic job: one GPU each, anywhere)
    placed: tuple[tuple[str, int], ...] = ()
    pod_milli: int = 0

    def pods(self) -> list[int]:
        if self.pod_milli and self.milli > self.pod_milli:
            return [self.pod_milli] * (self.milli // self.pod_milli)
        return [self.milli]

    @property
    def name(self) -> str:
        return self.label or f"job {self.id}"


@dataclass(frozen=True)
class KaiSnapshot:
    now: float
    capacity_milli: int
    queues: Mapping[str, KaiQueue]
    running: Sequence[KaiJob] = ()
    pending: Sequence[KaiJob] = ()
    runtime_s: Mapping[str, float] = field(default_factory=dict)  # mean run time per queue
    default_runtime_s: float = DEFAULT_RUNTIME_S
    parents: Mapping[str, KaiQueue] = field(default_factory=dict)  # departments' queues, by name
    # GPU milli per node (less what is not KAI's to give, e.g. workspaces): a pod needs its GPUs
    # on one node. Empty: GPUs are counted across the cluster
    nodes: Mapping[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class KaiEstimate:
    start: float | None  # None: no start in sight within HORIZON_S
    reason: str  # why then, in KAI's terms and plain words
    after: str = ""  # what it waits for ("job ab12 of nlp is expected to end"); "" to start now


@dataclass
class _Run:
    job: KaiJob
    started: float
    ends: float
    placed: tuple[tuple[str, int], ...] = ()  # (node, milli) of each pod; ("", milli) across the cluster


class _Space:
    """Free GPU milli per node; without nodes, one "" for the whole cluster. Pods go where
    they fit most tightly (KAI's default binpack)."""

    def __init__(self, free: dict[str, float]) -> None:
        self.free = free
        self._total = sum(free.values())

    def total(self) -> float:
        return self._total

    def largest(self) -> float:
        return max(self.free.values(), default=0.0)

    def fit(
        self, job: KaiJob, extra: Mapping[str, float] | None = None
    ) -> tuple[tuple[str, int], ...] | None:
        pods = job.pods()
        if sum(pods) > self.total() + sum((extra or {}).values()) + EPS:
            return None
        free = dict(self.free)
        for n, m in (extra or {}).items():
            free[n] = free.get(n, 0.0) + m
        placed = []
        for m in pods:
            spots = [(f, n) for n, f in free.items() if f >= m - EPS]
            if not spots:
                return None
            _, n = min(spots)
            free[n] -= m
            placed.append((n, m))
        return tuple(placed)

    def take(self, placed: tuple[tuple[str, int], ...]) -> None:
        for n, m in placed:
            if n in self.free:
                self.free[n] -= m
                self._total -= m

    def give(self, placed: tuple[tuple[str, int], ...]) -> None:
        for n, m in placed:
            if n in self.free:
                self.free[n] += m
                self._total += m


def fair_shares(
    capacity: float, queues: Mapping[str, KaiQueue], asks: Mapping[str, float]
) -> dict[str, float]:
    """Each queue's fair share of `capacity` (milli), KAI's division: quota first (at most
    what it asks), then the rest by queue priority, highest first, split by over-quota weight
    (water-filling: what a satisfied queue does not take goes to the others). A queue never
    asks beyond its limit."""
    asks = {q: min(asks.get(q, 0.0), queues[q].cap()) for q in queues}
    share = {q: min(float(queues[q].deserved_milli), asks.get(q, 0.0)) for q in queues}
    left = capacity - sum(share.values())
    for prio in sorted({q.priority for q in queues.values()}, reverse=True):
        group = [q for q in queues if queues[q].priority == prio and queues[q].weight > 0]
        while left > EPS:
            hungry = [q for q in group if asks.get(q, 0.0) - share[q] > EPS]
            if not hungry:
                break
            total = sum(queues[q].weight for q in hungry)
            given = 0.0
            for q in hungry:
                give = min(left * queues[q].weight / total, asks[q] - share[q])
                share[q] += give
                given += give
            left -= given
            if given <= EPS:
                break
    return share


def tree_shares(
    capacity: float,
    queues: Mapping[str, KaiQueue],
    parents: Mapping[str, KaiQueue],
    asks: Mapping[str, float],
) -> dict[str, float]:
    """Fair shares down KAI's queue tree: the parents (and leaves without one) divide the
    capacity, then each parent's share is divided among its leaves, both as `fair_shares`."""
    children: dict[str, dict[str, KaiQueue]] = {}
    top: dict[str, KaiQueue] = {}
    top_asks: dict[str, float] = {}
    for name, q in queues.items():
        if q.parent in parents:
            children.setdefault(q.parent, {})[name] = q
        else:
            top[name], top_asks[name] = q, asks.get(name, 0.0)
    for name, kids in children.items():
        top[name] = parents[name]
        top_asks[name] = sum(asks.get(k, 0.0) for k in kids)
    share = fair_shares(capacity, top, top_asks)
    out = {name: share[name] for name in queues if name in share}
    for name, kids in children.items():
        out.update(fair_shares(share[name], kids, asks))
    return out


def _order(job: KaiJob) -> tuple[object, ...]:
    return (-job.priority, job.submitted, job.id)


def _gpus(milli: float) -> str:
    return f"{milli / 1000:g}"


def forecast(snap: KaiSnapshot) -> dict[str, KaiEstimate]:
    """Every pending job's expected start and why, by replaying KAI's cycles forward."""
    now = snap.now

    def runtime(job: KaiJob) -> float:
        mean = snap.runtime_s.get(job.queue, snap.default_runtime_s)
        return min(mean, job.max_runtime_s) if job.max_runtime_s > 0 else mean

    runs: list[_Run] = []
    for j in snap.running:
        started = now if j.started is None else j.started
        ends = started + runtime(j)
        if ends <= now:  # ran past its mean already: as long again, the least surprising guess
            ends = now + max(now - started, 60.0)
            if j.max_runtime_s > 0:
                ends = min(ends, max(now, started + j.max_runtime_s))
        runs.append(_Run(j, started, ends))
    # where each run's pods are: the nodes given, else placed as KAI would have (tightest fit);
    # one that fits nowhere is left unplaced (it holds no node's GPUs here)
    space = _Space({n: float(m) for n, m in snap.nodes.items()} or {"": float(snap.capacity_milli)})
    if snap.nodes:
        for r in runs:
            r.placed = tuple((n, m) for n, m in r.job.placed if n in snap.nodes)
            space.take(r.placed)
        for r in runs:
            if not r.placed:
                r.placed = space.fit(r.job) or ()
                space.take(r.placed)
    else:
        for r in runs:
            r.placed = (("", r.job.milli),)
    biggest = max(snap.nodes.values(), default=snap.capacity_milli)
    waiting = {j.id: j for j in snap.pending if j.queue in snap.queues}
    need: dict[str, float] = {}  # a reclaimed job resumes from its checkpoint: what it had left
    out: dict[str, KaiEstimate] = {}
    blocked: dict[str, str] = {}
    stuck: dict[str, str] = {}
    for j in snap.pending:
        q = snap.queues.get(j.queue)
        if q is None:
            out[j.id] = KaiEstimate(None, f"its queue {j.queue} is not one of KAI's queues known here")
        elif j.milli > q.cap():
            out[j.id] = KaiEstimate(
                None,
                f"it asks for {_gpus(j.milli)} GPUs, more than queue {q.name}'s limit of {_gpus(q.cap())}",
            )
            waiting.pop(j.id)
        elif j.milli > snap.capacity_milli:
            out[j.id] = KaiEstimate(
                None,
                f"it asks for {_gpus(j.milli)} GPUs, more than the cluster's {_gpus(snap.capacity_milli)}",
            )
            waiting.pop(j.id)
        elif max(j.pods()) > biggest:
            out[j.id] = KaiEstimate(
                None, f"it asks for {_gpus(max(j.pods()))} GPUs in one pod, more than any node has"
            )
            waiting.pop(j.id)
    t, after = now, ""
    for _ in range(MAX_CYCLES):
        if all(j.id in out for j in snap.pending) or t > now + HORIZON_S:
            break
        stuck = {}  # a queue passed over this cycle: why its jobs wait
        _cycle(snap, t, after, runs, waiting, need, out, blocked, stuck, runtime)
        # the next moment anything changes: a run's expected end, or a run passing its min runtime
        endings = [(r.ends, f"{r.job.name} is expected to end") for r in runs if r.ends > t]
        ripe = [
            (
                r.started + snap.queues[r.job.queue].min_runtime_s,
                f"{r.job.name} passes its queue's min runtime",
            )
            for r in runs
            if r.job.queue in snap.queues and r.started + snap.queues[r.job.queue].min_runtime_s > t
        ]
        if not endings and not ripe:
            break
        t, after = min(endings + ripe)
        done = [r for r in runs if r.ends <= t]
        runs[:] = [r for r in runs if r.ends > t]
        if done:
            more = f" and {len(done) - 2} more" if len(done) > 2 else ""
            after = (
                " and ".join(r.job.name for r in done[:2])
                + more
                + (" are expected to end" if len(done) > 1 else " is expected to end")
            )
    never = "no start in sight within a week at the present load"
    return {
        j.id: out.get(j.id) or KaiEstimate(None, blocked.get(j.id) or stuck.get(j.queue) or never)
        for j in snap.pending
    }


def _cycle(
    snap: KaiSnapshot,
    t: float,
    after: str,
    runs: list[_Run],
    waiting: dict[str, KaiJob],
    need: dict[str, float],
    out: dict[str, KaiEstimate],
    blocked: dict[str, str],
    stuck: dict[str, str],
    runtime: Callable[[KaiJob], float],
) -> None:
    """One KAI cycle at time `t`: fair shares, then allocate, reclaim, preempt job by job."""
    queues = snap.queues
    alloc = {q: 0.0 for q in queues}
    for r in runs:
        if r.job.queue in alloc:
            alloc[r.job.queue] += r.job.milli
    other = sum(r.job.milli for r in runs if r.job.queue not in alloc)  # outside the queues known
    space = _Space({n: float(m) for n, m in snap.nodes.items()} or {"": float(snap.capacity_milli)})
    for r in runs:
        space.take(r.placed)
    by_queue: dict[str, list[KaiJob]] = {}  # each queue's waiting jobs in KAI's order
    for j in sorted(waiting.values(), key=_order):
        by_queue.setdefault(j.queue, []).append(j)
    at = dict.fromkeys(by_queue, 0)  # each queue's next job to try this cycle
    # the fewest GPUs any job from there on asks for: once none of them fits what is free, and
    # reclaim and preemption failed for fewer, the queue is done for this cycle (its later jobs
    # have no higher priority, so no more victims)
    least: dict[str, list[int]] = {}
    for name, jobs in by_queue.items():
        tail = [0] * len(jobs)
        m = 1 << 62
        for i in range(len(jobs) - 1, -1, -1):
            m = min(m, jobs[i].milli)
            tail[i] = m
        least[name] = tail
    asks = dict(alloc)
    for name, jobs in by_queue.items():
        asks[name] += sum(j.milli for j in jobs)
    fair = tree_shares(snap.capacity_milli - other, queues, snap.parents, asks)
    # what a reclaim or a preemption could not free for a queue this cycle: a later job of it
    # as big or bigger is not searched for again (the search is over every run)
    no_reclaim: dict[str, float] = {}
    no_preempt: dict[str, float] = {}
    lowest: dict[str, int] = {}  # the lowest priority running in each queue: none lower, no preemption
    # what reclaim may take this cycle: runs past their min runtime in queues over their fair
    # share or their quota at its start (`_reclaim` says which may go), in KAI's order (most over
    # first; lowest priority, youngest first)
    over = {k for k in queues if alloc[k] > min(fair[k], queues[k].deserved_milli) + EPS}
    takeable = sorted(
        (r for r in runs if r.job.queue in over and _ripe(r, t, queues)),
        key=lambda r: (-(alloc[r.job.queue] - fair[r.job.queue]), r.job.priority, -r.started),
    )
    for r in runs:
        lowest[r.job.queue] = min(lowest.get(r.job.queue, r.job.priority), r.job.priority)

    def key(j: KaiJob) -> tuple[object, ...]:
        q = queues[j.queue]
        over = alloc[j.queue] > fair[j.queue] + EPS
        within_quota = alloc[j.queue] + j.milli <= q.deserved_milli + EPS
        zero = fair[j.queue] <= EPS
        share = (alloc[j.queue] + j.milli) / max(fair[j.queue], EPS)
        return (over, not within_quota, -q.priority, zero, share, _order(j))

    while True:
        free = space.total()
        for name, i in at.items():
            if (
                i < len(by_queue[name])
                and least[name][i] > free + EPS
                and least[name][i] >= no_reclaim.get(name, float("inf"))
                and least[name][i] >= no_preempt.get(name, float("inf"))
            ):
                stuck[name] = _why_waiting(by_queue[name][i], queues[name], alloc, fair)
                at[name] = len(by_queue[name])
        heads = [by_queue[name][i] for name, i in at.items() if i < len(by_queue[name])]
        if not heads:
            return
        job = min(heads, key=key)
        at[job.queue] += 1  # tried: KAI passes over a job that does not fit, to the next
        q = queues[job.queue]
        victims: list[_Run] = []
        how = ""
        placed = space.fit(job)
        if placed is None:
            if job.milli < no_reclaim.get(job.queue, float("inf")):
                victims, how, placed = _reclaim(job, takeable, alloc, fair, space, queues)
                if not victims:
                    no_reclaim[job.queue] = job.milli
            if victims:
                pass
            elif lowest.get(job.queue, job.priority) >= job.priority:
                no_preempt[job.queue] = 0  # nothing of lower priority runs there: nor for its later jobs
            elif job.milli < no_preempt.get(job.queue, float("inf")):
                victims, how, placed = _preempt(job, t, runs, queues, space)
                if not victims:
                    no_preempt[job.queue] = job.milli
            if not victims or placed is None:
                blocked[job.id] = _why_waiting(job, q, alloc, fair)
                continue
        # the limits, with what its victims free counted (a reclaim within one department, a
        # preemption within one queue, leaves their limits as they were)
        if (
            alloc[job.queue] - sum(v.job.milli for v in victims if v.job.queue == job.queue) + job.milli
            > q.cap() + EPS
        ):
            blocked[job.id] = f"queue {q.name} is at its limit of {_gpus(q.cap())} GPUs"
            continue
        up = snap.parents.get(q.parent)
        if up is not None:
            kin = [k for k in queues if queues[k].parent == q.parent]
            used = sum(alloc[k] for k in kin) - sum(v.job.milli for v in victims if v.job.queue in kin)
            if used + job.milli > up.cap() + EPS:
                blocked[job.id] = (
                    f"its department's queue {up.name} is at its limit of {_gpus(up.cap())} GPUs"
                )
                continue
        gone = {id(v) for v in victims}
        if gone:
            takeable = [r for r in takeable if id(r) not in gone]
        for v in victims:  # back to its queue (from the next cycle); it resumes with what it had left
            runs.remove(v)
            alloc[v.job.queue] += -v.job.milli
            space.give(v.placed)
            need[v.job.id] = max(60.0, v.ends - t)
            waiting[v.job.id] = replace(v.job, started=None)  # its first start stays its estimate
        within = alloc[job.queue] + job.milli <= q.deserved_milli + EPS
        if how:
            reason = how
        elif within:
            reason = f"within queue {q.name}'s guarantee of {_gpus(q.deserved_milli)} GPUs"
        else:
            reason = (
                f"beyond queue {q.name}'s guarantee of {_gpus(q.deserved_milli)} GPUs, on idle GPUs"
                f" (over-quota weight {q.weight:g}): it may be reclaimed"
            )
        if job.id not in out:
            out[job.id] = KaiEstimate(t, reason, after if t > snap.now else "")
        waiting.pop(job.id, None)
        length = need.pop(job.id, None) or runtime(job)
        runs.append(_Run(replace(job, started=t), t, t + length, placed))
        space.take(placed)
        lowest[job.queue] = min(lowest.get(job.queue, job.priority), job.priority)
        alloc[job.queue] += job.milli


def _ripe(r: _Run, t: float, queues: Mapping[str, KaiQueue]) -> bool:
    q = queues.get(r.job.queue)
    return r.job.preemptible and q is not None and t - r.started >= q.min_runtime_s - EPS


Placed = tuple[tuple[str, int], ...]


def _reclaim(
    job: KaiJob,
    takeable: list[_Run],
    alloc: Mapping[str, float],
    fair: Mapping[str, float],
    space: _Space,
    queues: Mapping[str, KaiQueue],
) -> tuple[list[_Run], str, Placed | None]:
    """KAI's reclaim (its proportion plugin): only for a job whose queue stays within its fair
    share, from jobs past the min runtime. Each victim is judged, as KAI judges it, by what its
    queue holds before that victim is taken: more than the larger of its quota and fair share
    (maintain fair share), or, when the job's queue stays within its own quota, more than the
    victim's quota (guarantee deserved quota). The victim's queue may end below its fair share:
    a queue that borrows its whole GPU gives it back to a queue due its quota."""
    if alloc[job.queue] + job.milli > fair[job.queue] + EPS:
        return [], "", None
    starved = alloc[job.queue] + job.milli <= queues[job.queue].deserved_milli + EPS
    pool = [r for r in takeable if r.job.queue != job.queue]

    def over_its_share(r: _Run, left: dict[str, float]) -> bool:
        q, have = queues[r.job.queue], left[r.job.queue]
        allocatable = min(max(float(q.deserved_milli), fair[r.job.queue]), q.cap())
        return have > allocatable + EPS or (starved and have > q.deserved_milli + EPS)

    taken, placed = _victims(job, space, pool, over_its_share, alloc)
    if not taken:
        return [], "", None
    names = sorted({r.job.queue for r in taken})
    return (
        taken,
        (
            f"reclaims GPUs for queue {job.queue} (within its fair share) from queue"
            f"{'s' if len(names) > 1 else ''} {', '.join(names)} over theirs"
            f" ({', '.join(r.job.name for r in taken[:3])}{', ...' if len(taken) > 3 else ''})"
        ),
        placed,
    )


def _preempt(
    job: KaiJob, t: float, runs: list[_Run], queues: Mapping[str, KaiQueue], space: _Space
) -> tuple[list[_Run], str, Placed | None]:
    """KAI's preempt: a job takes GPUs from lower-priority jobs of its own queue past the min runtime."""
    pool = [
        r for r in runs if r.job.queue == job.queue and r.job.priority < job.priority and _ripe(r, t, queues)
    ]
    pool.sort(key=lambda r: (r.job.priority, -r.started))
    taken, placed = _victims(job, space, pool, lambda r, left: True, {})
    if not taken:
        return [], "", None
    return taken, f"preempts lower-priority {', '.join(r.job.name for r in taken[:3])} of its queue", placed


def _victims(
    job: KaiJob,
    space: _Space,
    pool: list[_Run],
    allowed: Callable[[_Run, dict[str, float]], bool],
    alloc: Mapping[str, float],
) -> tuple[list[_Run], Placed | None]:
    """The fewest runs of `pool` (in its order, each `allowed` given what its queue would keep)
    whose end lets `job` fit: for a job of one pod, on the one node where the fewest do."""
    pods = job.pods()
    if len(pods) == 1:
        need = pods[0]
        on: dict[str, list[_Run]] = {}
        for r in pool:
            for n in {n for n, _ in r.placed}:
                on.setdefault(n, []).append(r)
        best: tuple[list[_Run], Placed | None] = ([], None)
        for n, rs in on.items():
            have, left, taken = space.free.get(n, 0.0), dict(alloc), []
            for r in rs:
                if have >= need - EPS:
                    break
                if not allowed(r, left):
                    continue
                taken.append(r)
                if r.job.queue in left:
                    left[r.job.queue] -= r.job.milli
                have += sum(m for k, m in r.placed if k == n)
            if have >= need - EPS and taken and (not best[0] or len(taken) < len(best[0])):
                best = (taken, ((n, need),))
        return best
    left, taken, extra = dict(alloc), [], dict[str, float]()  # several pods: runs in order until they fit
    for r in pool:
        if not allowed(r, left):
            continue
        taken.append(r)
        if r.job.queue in left:
            left[r.job.queue] -= r.job.milli
        for n, m in r.placed:
            extra[n] = extra.get(n, 0.0) + m
        placed = space.fit(job, extra)
        if placed is not None:
            return taken, placed
    return [], None


def _why_waiting(job: KaiJob, q: KaiQueue, alloc: Mapping[str, float], fair: Mapping[str, float]) -> str:
    if alloc[job.queue] + job.milli > fair[job.queue] + EPS:
        return (
            f"queue {q.name} would exceed its fair share ({_gpus(fair[job.queue])} GPUs) and no GPUs are idle"
        )
    return "no GPUs idle, and none KAI may reclaim or preempt yet"
