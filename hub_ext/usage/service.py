"""Usage accounting, budgets and right-sizing in the hub process: the one object the API, the
admin page, the spawner's admission check, the culler's targets and the training service ask.
Built once by the hub's set-up from c.Usage (`build_usage`)."""

from __future__ import annotations

import csv
import io
import logging
import time
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from gpupool.pool.errors import QuotaExceeded
from gpupool.pool.units import format_gpu_hours, format_gpus
from gpupool.usage import accounting as acc
from gpupool.usage import budgets as bud
from gpupool.usage.config import Usage
from gpupool.usage.ledger import Ledger
from gpupool.usage.rightsizing import Advice, advise, freed
from gpupool.vocab.culler_wire import Finding
from gpupool.vocab.culling import BudgetAction
from gpupool.vocab.kinds import WorkloadKind
from gpupool.vocab.states import JobState

if TYPE_CHECKING:
    from gpupool.alloc.manager import PoolManager
    from gpupool.store.jobs import TrainJob

log = logging.getLogger("gpupool.usage")
SORTS = ("waste", "allocated", "used", "cost", "parked", "key")
MAX_BUCKETS = 500
CACHE_S = 10.0


class BudgetRefused(QuotaExceeded):
    """Over the GPU-hour budget: a new workload above the minimum share is refused (403)."""


def clock_text(t: float | None) -> str:
    return time.strftime("%a %H:%M", time.localtime(t)) if t else ""


class UsageService:
    def __init__(
        self,
        pool: PoolManager,
        cfg: Usage | None = None,
        groups_of: Callable[[str], tuple[str, ...]] | None = None,
        clock: Callable[[], float] = time.time,
        parking: bool = False,
        group_map: Callable[[], dict[str, tuple[str, ...]]] | None = None,
    ) -> None:
        self.pool, self.cfg = pool, cfg or Usage()
        self.ledger = Ledger(pool.store, pool.inventory, getattr(pool, "node_pools", {}))
        self.rules = self.cfg.budget_rules()
        self.prices = self.cfg.price_table()
        self.groups_of = groups_of or (lambda owner: ())
        # every user's groups in one read (the hub's, on its loop): what a report off the loop uses
        self.group_map = group_map
        self.clock = clock
        self.parking = parking  # the hub parks GPUs (over-budget idle workspaces are parked, not stopped)
        # budget states for the culler's targets and the training ticks, which ask for every
        # workspace and queued job again and again: read again after CACHE_S (admissions never use it)
        self._cache: dict[tuple[str, tuple[str, ...]], tuple[float, list[bud.State]]] = {}

    def now(self) -> int:
        return int(self.clock())

    # --- reports ---------------------------------------------------------------------
    async def report_off_loop(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
        """`report` in a worker thread, the hub's loop free meanwhile (a report over a class of 166
        took it 2-5 s): every user's groups are read once, here on the loop (the hub's database
        session is the loop's), and the report reads that map, never the hub."""
        import asyncio

        if self.group_map is not None:
            groups = self.group_map()
            kwargs["groups_of"] = lambda owner: groups.get(owner, ())
        return await asyncio.to_thread(self.report, *args, **kwargs)

    def report(
        self,
        a: int,
        b: int,
        by: str,
        owner: str | None = None,
        step: int | None = None,
        sort: str = "waste",
        offset: int = 0,
        limit: int = 100,
        groups_of: Callable[[str], tuple[str, ...]] | None = None,
    ) -> dict[str, Any]:
        """Totals per key of `by` over [a, b), sorted and paged; `owner`: only their own use;
        `groups_of`: users' groups (default: the hub's, asked per user)."""
        groups_of = groups_of or self.groups_of
        now = self.now()
        held = self.ledger.held(a, b, owner)
        uses = self.ledger.uses(a, b, owner)
        parked = self.ledger.parked(a, b, owner)
        jobs = [j for j in self.ledger.job_events(a, b) if owner is None or j.owner == owner]
        per = acc.totals(held, a, b, now, by, uses, parked, jobs, self.prices, groups_of)
        rows = [{"key": k, **self._json(t)} for k, t in per.items()]
        key = {
            "waste": "waste_milli_s",
            "allocated": "allocated_milli_s",
            "used": "used_milli_s",
            "cost": "cost_micro",
            "parked": "parked_milli_s",
        }.get(sort)
        rows.sort(key=(lambda r: (-r[key], r["key"])) if key else (lambda r: r["key"]))
        # every session counts once in the total, even where a dimension counts it in several keys
        total = acc.Totals()
        for t in (
            per
            if by in ("user", "project", "model", "kind")
            else acc.totals(held, a, b, now, "kind", uses, parked, jobs, self.prices)
        ).values():
            total.add(t)
        out: dict[str, Any] = {
            "from": a,
            "to": b,
            "now": now,
            "by": by,
            "sort": sort,
            "offset": offset,
            "limit": limit,
            "rows_total": len(rows),
            "rows": rows[offset : offset + limit],
            "total": self._json(total),
            "currency": self.cfg.currency,
            "waits": acc.waits(jobs, a, b),
        }
        if step:
            values = acc.series(held, a, b, step, now, by, groups_of)
            order = sorted(values, key=lambda k: -sum(values[k]))
            out["series"] = {
                "start": a,
                "step_s": step,
                "keys": order,
                "gpus": {k: [round(v / step / 1000, 4) for v in values[k]] for k in order},
            }
        sess = acc.sessions(held, uses)
        out["over_requesters"] = acc.over_requesters(sess, held, a, b, now)
        out["rightsizing"] = self._rightsizing(sess, held, a, b, now, groups_of)
        return out

    def _json(self, t: acc.Totals) -> dict[str, Any]:
        h = acc.gpu_hours
        return {
            "allocated_gpu_hours": h(t.allocated),
            "measured_gpu_hours": h(t.measured),
            "used_gpu_hours": h(t.used),
            "waste_gpu_hours": h(t.waste),
            "parked_gpu_hours": h(t.parked),
            "parked_hours": round(t.parked_s / 3600, 3),
            "cost": round(t.cost / 1_000_000, 2),
            "jobs_run": t.jobs_run,
            "jobs_failed": t.jobs_failed,
            "jobs_preempted": t.jobs_preempted,
            "peak_memory_mib": t.peak_memory_mib,
            "share_memory_mib": t.share_memory_mib,
            "allocated_milli_s": t.allocated,
            "measured_milli_s": t.measured,
            "used_milli_s": t.used,
            "waste_milli_s": t.waste,
            "parked_milli_s": t.parked,
            "cost_micro": t.cost,
        }

    def _rightsizing(
        self,
        sess: list[acc.Session],
        held: list[acc.Held],
        a: int,
        b: int,
        now: int,
        groups_of: Callable[[str], tuple[str, ...]],
    ) -> list[dict[str, Any]]:
        n = self.cfg.rightsizing_sessions
        if not n:
            return []
        out = []
        for owner in sorted({s.owner for s in sess}):
            advice = advise(sess, owner, self.sizes_for(owner, groups_of), n)
            if advice is not None:
                out.append(
                    {
                        "user": owner,
                        "current_gpus": advice.current_milli / 1000,
                        "suggested_gpus": advice.suggested_milli / 1000,
                        "peak_memory_mib": advice.peak_memory_mib,
                        "share_memory_mib": advice.share_memory_mib,
                        "would_free_gpu_hours": acc.gpu_hours(freed(advice, held, a, b, now)),
                    }
                )
        return sorted(out, key=lambda r: -r["would_free_gpu_hours"])

    def sizes_for(
        self, owner: str, groups_of: Callable[[str], tuple[str, ...]] | None = None
    ) -> tuple[int, ...]:
        return tuple(self.pool.quotas.limits_for(list((groups_of or self.groups_of)(owner))).sizes_milli)

    def csv(self, report: dict[str, Any]) -> str:
        cols = [
            "key",
            "allocated_gpu_hours",
            "measured_gpu_hours",
            "used_gpu_hours",
            "waste_gpu_hours",
            "parked_hours",
            "parked_gpu_hours",
            "cost",
            "jobs_run",
            "jobs_failed",
            "jobs_preempted",
            "peak_memory_mib",
            "share_memory_mib",
        ]
        buf = io.StringIO()
        w = csv.writer(buf, lineterminator="\n")
        w.writerow([report["by"], *cols[1:]])
        for r in report["rows"]:
            w.writerow([_cell(r[c]) for c in cols])
        return buf.getvalue()

    # --- advice ------------------------------------------------------------------------
    def advice_for(self, owner: str, groups: Iterable[str]) -> Advice | None:
        """Right-sizing advice from `owner`'s last sessions (within retention)."""
        n = self.cfg.rightsizing_sessions
        if not n:
            return None
        now = self.now()
        a = now - int(self.cfg.retention_days * 86400)
        held = self.ledger.held(a, now + 1, owner)
        sess = acc.sessions(held, self.ledger.uses(a, now + 1, owner))
        sizes = self.pool.quotas.limits_for(list(groups)).sizes_milli
        return advise(sess, owner, sizes, n)

    def form_notes(self, owner: str, groups: Iterable[str]) -> list[str]:
        """What the spawn form says first: the budget near or over its limit, a smaller size."""
        groups = tuple(groups)
        notes = []
        shown = bud.worst(self.budget_states(owner, groups)) if self.rules else None
        if shown is not None and shown.status in ("near", "over"):
            notes.append(f"GPU-hour budget: {shown.message(clock_text)}.")
        advice = self.advice_for(owner, groups)
        if advice is not None:
            notes.append(f"A smaller size would do: {advice.message()}.")
        return notes

    # --- budgets ---------------------------------------------------------------------------
    def budget_states(self, owner: str, groups: Iterable[str], now: int | None = None) -> list[bud.State]:
        """Every budget that applies to `owner` (none configured: [])."""
        groups = tuple(groups)
        rules = bud.rules_for(self.rules, owner, groups)
        if not rules:
            return []
        now = self.now() if now is None else now
        window = max(r.window_s for r in rules)
        mine = self.ledger.held(now - window, now + 1, owner)
        grants = self.ledger.grants(now)
        out = []
        for r in rules:
            if r.shared:
                group = r.target.removeprefix(bud.GROUP)
                held = [
                    h
                    for h in self.ledger.held(now - r.window_s, now + 1)
                    if group in (h.groups or self.groups_of(h.owner))
                ]
                out.append(bud.state(r, held, grants, now, owner))
            else:
                out.append(bud.state(r, mine, grants, now, owner))
        return out

    def budget_json(self, owner: str, groups: Iterable[str]) -> dict[str, Any]:
        states = self.budget_states(owner, groups)
        shown = bud.worst(states)
        return {
            "user": owner,
            "status": shown.status if shown else "none",
            "message": shown.message(clock_text) if shown else "",
            "budgets": [
                {
                    "target": s.rule.target,
                    "shared": s.rule.shared,
                    "status": s.status,
                    "used_gpu_hours": acc.gpu_hours(s.used_milli_s),
                    "limit_gpu_hours": acc.gpu_hours(s.limit_milli_s),
                    # as every screen shows them (gpupool.pool.units), so the lab's toast agrees
                    "used_text": format_gpu_hours(s.used_milli_s),
                    "limit_text": format_gpu_hours(s.limit_milli_s),
                    "window_days": s.rule.window_s / 86400,
                    "used_pct": s.used_pct,
                    "min_share_gpus": s.rule.min_share_milli / 1000,
                    "frees_at": s.frees_at,
                    "message": s.message(clock_text),
                }
                for s in states
            ],
        }

    def budget_users(
        self, limit: int = 200, groups_of: Callable[[str], tuple[str, ...]] | None = None
    ) -> list[dict[str, Any]]:
        """Users with a budget who held GPUs in the longest window: their state, worst first."""
        groups_of = groups_of or self.groups_of
        if not self.rules:
            return []
        now = self.now()
        window = max(r.window_s for r in self.rules)
        out = []
        for owner in sorted({h.owner for h in self.ledger.held(now - window, now + 1)}):
            j = self.budget_json(owner, groups_of(owner))
            if j["budgets"]:
                out.append(j)
        order = {"over": 0, "near": 1, "ok": 2, "exempt": 3}
        out.sort(
            key=lambda j: (order.get(j["status"], 4), -max(b["used_pct"] for b in j["budgets"]), j["user"])
        )
        return out[:limit]

    def check(self, owner: str, groups: Iterable[str], milli: int, kind: WorkloadKind) -> None:
        """Raise BudgetRefused when `owner` is over a budget and the new workload is refused."""
        if not self.rules:
            return
        refusing = bud.admits(self.budget_states(owner, groups), milli, kind)
        if refusing is None:
            return
        what = f"a workspace of {format_gpus(milli)}" if kind == WorkloadKind.BUILD else "a train job"
        when = f"; it has room again at {clock_text(refusing.frees_at)}" if refusing.frees_at else ""
        small = (
            f"; a workspace of at most {format_gpus(refusing.rule.min_share_milli)} still starts"
            if kind == WorkloadKind.BUILD and refusing.rule.min_share_milli
            else ""
        )
        used, limit = format_gpu_hours(refusing.used_milli_s), format_gpu_hours(refusing.limit_milli_s)
        raise BudgetRefused(
            f"{what} is refused: your GPU-hour budget ({refusing.rule.describe()}) is used up,"
            f" {used} of {limit} GPU-h ({refusing.used_pct} %){when}{small}."
            " Running work keeps running; ask an admin for a top-up"
        )

    def over(self, owner: str, groups: Iterable[str]) -> bud.State | None:
        """The budget `owner` is over, if any (exempt: never), as known at most CACHE_S ago."""
        if not self.rules:
            return None
        key = (owner, tuple(sorted(groups)))
        now = self.clock()
        hit = self._cache.get(key)
        if hit is None or now - hit[0] >= CACHE_S:
            if len(self._cache) > 10_000:  # bounded: users come and go
                self._cache.clear()
            hit = self._cache[key] = (now, self.budget_states(owner, key[1]))
        return next((s for s in hit[1] if s.status == "over"), None)

    def add_grant(self, target: str, kind: str, milli_s: int, until: int, by: str, note: str = "") -> int:
        """An admin's top-up or exemption (gpupool.usage.ledger), in force at once: the budget
        states cached for holds and the culler are read again at their next ask, so a top-up
        releases a held job on the next training pass, not up to CACHE_S later."""
        grant = self.ledger.add_grant(target, kind, milli_s, until, by, note)
        self._cache.clear()
        return grant

    def end_grant(self, grant_id: int, now: float, by: str) -> bool:
        """End a grant now; as add_grant, what the cache held under it is read again."""
        ended = self.ledger.end_grant(grant_id, now, by)
        self._cache.clear()
        return ended

    def culler_action(self, owner: str, groups: Iterable[str]) -> BudgetAction:
        """For the culler's targets: what to do with an idle GPU of `owner` (NONE: nothing)."""
        if self.over(owner, groups) is None:
            return BudgetAction.NONE
        if self.parking:
            return BudgetAction.PARK
        return BudgetAction.STOP if self.cfg.over_budget == "park-or-stop" else BudgetAction.NONE

    def held_jobs(self, rows: Iterable[TrainJob]) -> dict[str, str]:
        """Queued train jobs of owners over budget: they wait (job id -> why)."""
        if not self.rules:
            return {}
        out: dict[str, str] = {}
        seen: dict[str, bud.State | None] = {}
        for r in rows:
            if r.state != JobState.QUEUED:
                continue
            if r.owner not in seen:
                seen[r.owner] = self.over(r.owner, self.groups_of(r.owner))
            s = seen[r.owner]
            if s is not None:
                when = f" until {clock_text(s.frees_at)}" if s.frees_at else ""
                out[r.id] = (
                    f"held: {r.owner}'s GPU-hour budget ({s.rule.describe()}) is used up{when};"
                    " it starts once the budget has room (or an admin tops it up)"
                )
        return out

    # --- samples and retention --------------------------------------------------------------
    def record_report(self, workspaces: list[Finding], pass_time: float) -> None:
        # the culler's clock (another pod's, on Kubernetes) may run ahead of the hub's: a sample
        # filed under an hour that has not begun here is left out of every report until it does
        when = min(pass_time, self.now())
        try:
            self.ledger.record_samples(workspaces, when, self.cfg.sample_gap_s)
        except Exception:  # noqa: BLE001 - accounting must never break the culler's report
            log.exception("could not record the culler's GPU use samples")

    def prune(self) -> int:
        before = self.now() - self.cfg.retention_days * 86400
        n = self.ledger.prune(before)
        if n:
            log.info("usage retention: deleted %d records older than %.0f days", n, self.cfg.retention_days)
        return n


def _cell(value: object) -> object:
    """A CSV cell that a spreadsheet will not run: text starting with = + - @ is quoted with '."""
    if isinstance(value, str) and value[:1] in ("=", "+", "-", "@", "\t", "\r"):
        return "'" + value
    return value
