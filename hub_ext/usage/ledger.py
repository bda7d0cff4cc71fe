"""Reading usage out of the store, and writing the culler's samples into it (the I/O half of
gpupool.usage; the arithmetic is in `accounting`).

Allocated GPU-hours come from the event log: each `release` event carries the interval it
closes (`since`, share, node, GPUs, groups), so a closed interval needs no other record, and
the allocations still held are the rows of gpupool_allocations (since their `created`). Both
survive a hub restart, and reconcile's releases close what a crash left open. Parked intervals
come the same way from `unpark` events and gpupool_parked. A release written before these
fields existed is paired with its `allocate` event, when that is among the events read.

Train jobs on Kubernetes hold no allocation (the cluster's scheduler places them): their
GPU-hours are their pods' intervals, recorded in gpupool_pod_spans by the hub's relist of train
pods (gpupool.kube.pod_spans), and read here as train sessions beside the allocations.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable
from typing import Any, cast

from sqlalchemy import CursorResult, delete, or_, select

from gpupool.pool.inventory import Inventory
from gpupool.pool.pools import NodePool
from gpupool.pool.units import format_gpu_hours
from gpupool.store import (
    Allocation,
    BudgetGrant,
    Event,
    Parked,
    PodSpanRow,
    Store,
    TrainJob,
    UsageHour,
)
from gpupool.usage.accounting import Held, JobEvent, UseRow
from gpupool.usage.accounting import Parked as ParkedSpan
from gpupool.usage.budgets import Grant
from gpupool.vocab import states
from gpupool.vocab.culler_wire import Finding
from gpupool.vocab.kinds import EventKind, WorkloadKind

KINDS = (WorkloadKind.BUILD, WorkloadKind.TRAIN)
MAX_GRANT_NOTE = 500


def epoch(d: dt.datetime) -> float:
    """A stored time (naive UTC) as epoch seconds."""
    return d.replace(tzinfo=dt.UTC).timestamp()


def stored(t: float) -> dt.datetime:
    """Epoch seconds as the store keeps times (naive UTC)."""
    return dt.datetime.fromtimestamp(t, dt.UTC).replace(tzinfo=None)


class Ledger:
    def __init__(
        self, store: Store, inventory: Inventory, node_pools: dict[str, NodePool] | None = None
    ) -> None:
        self.store, self.inventory, self.node_pools = store, inventory, node_pools or {}
        self.last_sample: dict[tuple[str, str, str, int], float] = {}  # session -> time of its last sample
        self._where: dict[tuple[str, tuple[int, ...]], tuple[tuple[str, ...], str]] = {}

    # --- what was held ------------------------------------------------------------
    def held(self, a: float, b: float, owner: str | None = None) -> list[Held]:
        """Every allocation interval that overlaps [a, b) (open ones included)."""
        who = {"owner": owner} if owner is not None else {}
        with self.store.session() as s:
            q = (
                select(Event)
                .where(Event.kind.in_((EventKind.RELEASE, EventKind.ALLOCATE)), Event.time >= stored(a))
                .filter_by(**who)
                .order_by(Event.id)
            )
            events = list(s.scalars(q))
            rows = list(s.scalars(select(Allocation).filter_by(**who)))
            pods = list(
                s.scalars(
                    select(PodSpanRow)
                    .where(PodSpanRow.start < b, or_(PodSpanRow.end.is_(None), PodSpanRow.end >= a))
                    .filter_by(**who)
                )
            )
        out: list[Held] = []
        opened: dict[tuple[str, str, str], float] = {}  # for releases without `since`
        for e in events:
            data = e.data or {}
            kind = data.get("kind") or _kind_of(e.message)
            if kind not in KINDS:
                continue
            if e.kind == EventKind.ALLOCATE:
                opened[(kind, e.owner, e.name)] = epoch(e.time)
                continue
            since = data.get("since")
            if not isinstance(since, int | float):
                since = opened.pop((kind, e.owner, e.name), a)
            if since >= b:
                continue
            end = epoch(e.time)
            until = data.get("until")  # a restored backup's time: it ran no longer (gpupool.host.backup)
            if isinstance(until, int | float) and not isinstance(until, bool):
                end = max(since, min(end, until))
            out.append(
                self._held(
                    kind,
                    e.owner,
                    e.name,
                    data.get("milli"),
                    since,
                    end,
                    data.get("groups"),
                    data.get("node", ""),
                    data.get("gpus"),
                )
            )
        for r in rows:
            start = epoch(r.created)
            if start < b:
                out.append(
                    self._held(r.kind, r.owner, r.name, r.total_milli, start, None, r.groups, r.node, r.gpus)
                )
        for p in pods:  # a train pod on Kubernetes: its job holds no allocation, so none is counted twice
            out.append(
                self._held(WorkloadKind.TRAIN, p.owner, p.job, p.milli, p.start, p.end, (), p.node, ())
            )
        return self._with_projects(out)

    def _held(
        self,
        kind: str,
        owner: str,
        name: str,
        milli: Any,
        start: float,
        end: float | None,
        groups: Any,
        node: Any,
        gpus: Any,
    ) -> Held:
        gpus = tuple(g for g in (gpus or ()) if isinstance(g, int))
        pools, model = self._where_on(str(node or ""), gpus)
        return Held(
            WorkloadKind(kind),
            owner,
            name,
            int(milli or 0),
            int(start),
            None if end is None else int(end),
            tuple(sorted({str(g) for g in groups or ()})),
            "",
            pools,
            model,
        )

    def _where_on(self, node: str, gpus: tuple[int, ...]) -> tuple[tuple[str, ...], str]:
        """(node pools, GPU model) of GPUs `gpus` of `node` (a node no longer in the inventory: none, '?')."""
        key = (node, gpus)
        if key not in self._where:
            try:
                n = self.inventory.node(node)
            except KeyError:
                self._where[key] = ((), "?")
            else:
                on = [n.gpus[g] for g in gpus if 0 <= g < len(n.gpus)]
                pools = tuple(
                    p.name
                    for p in self.node_pools.values()
                    if on and any(p.has(node, g.index, g.model) for g in on)
                )
                self._where[key] = (pools, n.model or "?")
        return self._where[key]

    def _with_projects(self, held: list[Held]) -> list[Held]:
        from dataclasses import replace

        ids = {h.name for h in held if h.kind == WorkloadKind.TRAIN}
        if not ids:
            return held
        with self.store.session() as s:
            projects = dict(
                s.execute(select(TrainJob.id, TrainJob.project).where(TrainJob.id.in_(ids))).all()
            )
        return [
            replace(h, project=projects.get(h.name, "?")) if h.kind == WorkloadKind.TRAIN else h for h in held
        ]

    def parked(self, a: float, b: float, owner: str | None = None) -> list[ParkedSpan]:
        who = {"owner": owner} if owner is not None else {}
        with self.store.session() as s:
            events = list(
                s.scalars(
                    select(Event)
                    .where(Event.kind == EventKind.UNPARK, Event.time >= stored(a))
                    .filter_by(**who)
                )
            )
            rows = list(s.scalars(select(Parked).filter_by(**who)))
        out = []
        for e in events:
            data = e.data or {}
            since = data.get("since")
            if isinstance(since, int | float) and since < b:
                out.append(
                    ParkedSpan(
                        e.owner,
                        e.name,
                        int(data.get("milli") or 0),
                        int(since),
                        int(epoch(e.time)),
                        tuple(data.get("groups") or ()),
                    )
                )
        for r in rows:
            if r.parked_at < b:
                out.append(
                    ParkedSpan(
                        r.owner,
                        r.name,
                        len(r.gpus) * r.gpu_milli,
                        int(r.parked_at),
                        None,
                        tuple(r.groups or ()),
                    )
                )
        return out

    # --- what was used --------------------------------------------------------------
    def uses(self, a: float, b: float, owner: str | None = None) -> list[UseRow]:
        who = {"owner": owner} if owner is not None else {}
        with self.store.session() as s:
            rows = list(
                s.scalars(
                    select(UsageHour)
                    .where(UsageHour.hour >= int(a) // 3600, UsageHour.hour < -(-int(b) // 3600))
                    .filter_by(**who)
                )
            )
        return [
            UseRow(
                r.hour,
                r.kind,
                r.owner,
                r.name,
                r.since,
                r.milli,
                r.measured_milli_s,
                r.used_milli_s,
                r.peak_memory_mib,
                r.share_memory_mib,
            )
            for r in rows
        ]

    def record_samples(self, workspaces: Iterable[Finding], now: float, gap_s: float) -> int:
        """The culler's findings of one pass: GPU use of each build workspace with fresh data,
        added to its session's hour. A sample stands for the time since the session's last one
        (at most `gap_s`; the first after a hub restart: since the session began, as far)."""
        found = [
            w for w in workspaces if w.get("gpu_data") and isinstance(w.get("gpu_util_pct"), int | float)
        ]
        if not found:
            return 0
        allocations = {(r.owner, r.name): r for r in self.store.allocations(kind=WorkloadKind.BUILD)}
        hour = int(now) // 3600
        n = 0
        with self.store.session() as s:
            # this hour's cells in one read, not one query per workspace (a class of 5,000 each pass)
            cells = {
                (c.owner, c.name, c.since): c
                for c in s.scalars(
                    select(UsageHour).where(UsageHour.hour == hour, UsageHour.kind == WorkloadKind.BUILD)
                )
            }
            for w in found:
                row = allocations.get((w["owner"], w["name"]))
                if row is None:
                    continue  # parked or gone: no share to account
                since = int(epoch(row.created))
                key = (WorkloadKind.BUILD, row.owner, row.name, since)
                last = self.last_sample.get(key, float(since))
                seconds = int(max(0.0, min(gap_s, now - last)))
                self.last_sample[key] = now
                milli = row.total_milli
                util = max(0.0, min(100.0, float(w["gpu_util_pct"] or 0.0)))
                # SM use is a share of one whole GPU; a whole-GPU workspace reports its busiest GPU
                busy = min(milli, round(util / 100 * max(milli, 1000)))
                memory, share_mib = w.get("memory_mib"), w.get("memory_limit_mib")
                memory = memory if isinstance(memory, int | float) else 0
                share_mib = share_mib if isinstance(share_mib, int | float) else 0
                cell = cells.get((row.owner, row.name, since))
                if cell is None:
                    cell = UsageHour(
                        hour=hour,
                        kind=WorkloadKind.BUILD,
                        owner=row.owner,
                        name=row.name,
                        since=since,
                        milli=milli,
                        measured_milli_s=0,
                        used_milli_s=0,
                        peak_memory_mib=0,
                        share_memory_mib=0,
                        samples=0,
                    )
                    s.add(cell)
                    cells[(row.owner, row.name, since)] = cell
                cell.measured_milli_s += milli * seconds
                cell.used_milli_s += busy * seconds
                cell.peak_memory_mib = max(cell.peak_memory_mib, int(memory))
                cell.share_memory_mib = max(cell.share_memory_mib, int(share_mib))
                cell.samples += 1
                n += 1
        live = {(WorkloadKind.BUILD, r.owner, r.name, int(epoch(r.created))) for r in allocations.values()}
        for gone in set(self.last_sample) - live:
            del self.last_sample[gone]  # bounded: only sessions still held
        return n

    # --- train jobs -------------------------------------------------------------------
    def job_events(self, a: float, b: float) -> list[JobEvent]:
        """First starts (with their wait), preemptions and failures of train jobs in [a, b)."""
        with self.store.session() as s:
            kinds = (states.JobEvent.START, states.JobEvent.PREEMPT)
            events = list(
                s.scalars(
                    select(Event).where(
                        Event.kind.in_(kinds), Event.time >= stored(a), Event.time < stored(b)
                    )
                )
            )
            ids = {e.name for e in events}
            jobs = {j.id: j for j in s.scalars(select(TrainJob).where(TrainJob.id.in_(ids)))} if ids else {}
            failed = list(
                s.scalars(
                    select(TrainJob).where(
                        TrainJob.state == states.JobState.FAILED,
                        TrainJob.finished >= a,
                        TrainJob.finished < b,
                    )
                )
            )
        out = []
        for e in events:
            j = jobs.get(e.name)
            if j is None:
                continue
            t = int(epoch(e.time))
            out.append(
                JobEvent(states.JobEvent(e.kind), j.id, j.owner, j.project, t, int(max(0.0, t - j.submitted)))
            )
        out += [
            JobEvent(states.JobEvent.FAIL, j.id, j.owner, j.project, int(j.finished))
            for j in failed
            if j.finished is not None
        ]  # the query asked for a finish time
        return out

    # --- budgets ------------------------------------------------------------------------
    def grants(self, now: float) -> list[Grant]:
        with self.store.session() as s:
            rows = list(s.scalars(select(BudgetGrant).where(BudgetGrant.until > now)))
        return [Grant(r.target, r.kind, r.milli_s, r.until) for r in rows]

    def grant_rows(self, now: float) -> list[dict[str, object]]:
        with self.store.session() as s:
            rows = list(
                s.scalars(select(BudgetGrant).where(BudgetGrant.until > now).order_by(BudgetGrant.id))
            )
        return [
            {
                "id": r.id,
                "target": r.target,
                "kind": r.kind,
                "gpu_hours": r.milli_s / 3_600_000,
                "until": r.until,
                "by": r.by,
                "note": r.note,
            }
            for r in rows
        ]

    def add_grant(self, target: str, kind: str, milli_s: int, until: int, by: str, note: str = "") -> int:
        with self.store.session() as s:
            row = BudgetGrant(
                target=target, kind=kind, milli_s=milli_s, until=until, by=by, note=note[:MAX_GRANT_NOTE]
            )
            s.add(row)
            s.flush()
            s.add(
                Event(
                    kind=EventKind.BUDGET,
                    owner=by,
                    name=target,
                    message=f"{by} {'exempted' if kind == 'exempt' else 'topped up'} {target}"
                    + (f" by {format_gpu_hours(milli_s)} GPU-h" if kind == "topup" else "")
                    + f" until {stored(until):%Y-%m-%d %H:%M} UTC",
                    data={"kind": kind, "milli_s": milli_s, "until": until},
                )
            )
            return row.id

    def end_grant(self, grant_id: int, now: float, by: str) -> bool:
        with self.store.session() as s:
            row = s.get(BudgetGrant, grant_id)
            if row is None or row.until <= now:
                return False
            row.until = int(now)
            s.add(
                Event(
                    kind=EventKind.BUDGET,
                    owner=by,
                    name=row.target,
                    message=f"{by} ended the {row.kind} of {row.target}",
                    data={"grant": grant_id},
                )
            )
            return True

    # --- retention ------------------------------------------------------------------------
    def prune(self, before: float, batch: int = 5000) -> int:
        """Delete events, samples and ended grants older than `before`, `batch` rows at a time
        (a long delete would hold SQLite's write lock while spawns wait)."""
        n = 0
        while True:
            with self.store.session() as s:
                ids = list(s.scalars(select(Event.id).where(Event.time < stored(before)).limit(batch)))
                if ids:
                    s.execute(delete(Event).where(Event.id.in_(ids)))
            n += len(ids)
            if len(ids) < batch:
                break
        with self.store.session() as s:
            # a DELETE's result is a CursorResult (SQLAlchemy types execute() for any statement)
            for stmt in (
                delete(UsageHour).where(UsageHour.hour < int(before) // 3600),
                delete(BudgetGrant).where(BudgetGrant.until < before),
                delete(PodSpanRow).where(PodSpanRow.end < before),  # open spans are kept
            ):
                n += cast("CursorResult[Any]", s.execute(stmt)).rowcount or 0
        return n


def _kind_of(message: str) -> str:
    """The workload kind of an event written before events said it: "build ann/x released ..."."""
    return message.split(" ", 1)[0] if message else ""
