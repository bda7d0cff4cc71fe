"""What the admin page shows, as plain data for its template (no HTML here but the plot)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from gpupool.api.auth import Caller
from gpupool.api.page import svg_plot
from gpupool.api.pool import gpu_table
from gpupool.api.quotas import current_quotas
from gpupool.pool import format_gpus
from gpupool.pool.units import parse_gpus
from gpupool.settings.config import quota_notes
from gpupool.vocab.kinds import EventKind
from gpupool.vocab.states import HAS_RUN, UNFINISHED, JobEvent, JobState

if TYPE_CHECKING:
    from gpupool.alloc.manager import PoolManager
    from gpupool.api.auth import ApiRoot, Directory
    from gpupool.api.services import ApiServices
    from gpupool.store.jobs import TrainJob
    from gpupool.train.backend import TrainingBackend

# what an admin must know (the page's last events): among them, a stored setting no longer applies
EVENT_KINDS = frozenset(
    {
        EventKind.CULL,
        EventKind.HIBERNATE,
        EventKind.WARN,
        JobEvent.PREEMPT,
        JobEvent.REQUEUE,
        JobEvent.RESUME,  # the same word as a workspace's resume (EventKind.RESUME)
        EventKind.MEMORY,
        EventKind.QUOTA,
        JobEvent.CANCEL,
        EventKind.SETTING_SKIPPED,
        JobEvent.DISK_LIMIT,
    }
)


def admin_view(services: ApiServices, root: ApiRoot, caller: Caller) -> dict[str, object]:
    """Everything the page renders, read from the gpupool API's settings (the pool, the
    training service, the culler's history) in the hub process."""
    pool = services.pool
    training = services.training
    history = services.history
    return {
        "gpus": gpus(pool, caller),
        "plot": svg_plot(list(history.points), pool.inventory.gpu_count),
        "jobs": jobs(training) if training is not None else None,
        "projects": projects(training) if training is not None else [],
        "departments": departments(training) if training is not None else [],
        "groups": groups(root, services.directory),
        "default_quota": format_gpus(pool.quotas.limits_for([]).quota_milli),
        "quota_notes": quota_notes(pool.quotas),  # what the quotas in force shut out
        "hibernated": hibernated(pool, services.hibernate_keep_days),
        "events": [
            {"time": f"{e.time:%Y-%m-%d %H:%M:%S}", "kind": e.kind, "message": e.message}
            for e in pool.store.events(limit=300)
            if e.kind in EVENT_KINDS
        ][:30],
    }


def hibernated(pool: PoolManager, keep_days: float) -> list[dict[str, object]]:
    """Every hibernated session with the size its save reported (gpupool.api.hibernation)."""
    import time

    from gpupool.api.hibernation import records, with_expiry

    def when(t: float | None) -> str:
        return time.strftime("%Y-%m-%d %H:%M", time.localtime(t)) if t else "kept until woken"

    return [
        {
            "owner": r.get("owner", ""),
            "name": r.get("name") or "default",
            "size": f"{int(r.get('bytes') or 0) / (1 << 20):.1f} MiB",
            "at": when(r.get("at")),
            "expires": when(r["expires"]),
            "by": "its user" if r.get("by") == "user" else "the idle culler",
            "notebooks": ", ".join(r.get("notebooks") or []),
        }
        for r in (with_expiry(r, keep_days) for r in records(pool.store))
    ]


def gpus(pool: PoolManager, caller: Caller) -> list[dict[str, object]]:
    out = []
    for gpu in gpu_table(pool, caller):
        held = ", ".join(
            f"{s['owner']}{'/' + s['name'] if s['name'] else ''} ({format_gpus(s['milli'])}, {s['kind']})"
            for s in gpu["shares"]
        )
        out.append({**gpu, "allocated_milli": 1000 - gpu["free_milli"], "held_by": held or "—"})
    return out


def jobs(training: TrainingBackend) -> list[dict[str, Any]]:
    """Active jobs and the last ten ended ones: why each waits or its last preemption."""
    from gpupool.train.waiting import explain, last_preemption

    rows = training.jobs()
    active = [j for j in rows if j.state in UNFINISHED]
    ended = sorted(
        (j for j in rows if j.state not in UNFINISHED), key=lambda j: j.finished or 0, reverse=True
    )[:10]
    held = training.holds(active) if training.holds is not None else {}  # GPU-hour budgets
    return [
        {
            "id": j.id,
            "name": j.name,
            "owner": j.owner,
            "project": j.project,
            "state": j.state,
            "gpus": format_gpus(j.total_milli),
            "active": j.state in UNFINISHED,
            "why": held.get(j.id)
            or explain(training, j)
            or last_preemption(training.pool, j)
            or j.message
            or "",
        }
        for j in active + ended
    ]


def _in_use(jobs: list[TrainJob], projects: set[str]) -> int:
    return sum(j.total_milli for j in jobs if j.project in projects and j.state in HAS_RUN)


def _limit(milli: int) -> str:
    return "none" if milli < 0 else format_gpus(milli)


def projects(training: TrainingBackend) -> list[dict[str, Any]]:
    rows = training.jobs()
    return [
        {
            "name": p.name,
            "department": p.department,
            "guarantee": format_gpus(p.guarantee_milli),
            "limit": _limit(p.limit_milli),
            "in_use": format_gpus(_in_use(rows, {p.name})),
            "queued": sum(1 for j in rows if j.project == p.name and j.state == JobState.QUEUED),
        }
        for p in training.projects.values()
    ]


def departments(training: TrainingBackend) -> list[dict[str, Any]]:
    rows = training.jobs()
    out = []
    for d in training.departments.values():
        members = [p.name for p in training.projects.values() if p.department == d.name]
        out.append(
            {
                "name": d.name,
                "projects": ", ".join(members),
                "guarantee": format_gpus(d.guarantee_milli),
                "limit": _limit(d.limit_milli),
                "in_use": format_gpus(_in_use(rows, set(members))),
            }
        )
    return out


def groups(root: ApiRoot, directory: Directory | None = None) -> list[dict[str, object]]:
    """Every group with a build override or a total (teaching labs): its quota per member,
    what its members hold together (its members now, as the hub has them) and, where set, its
    `group_totals` ceiling."""
    pool = root.pool
    quotas = current_quotas(root)
    overrides: dict[str, Any] = quotas.get("group_overrides") or {}
    totals = getattr(pool.quotas, "group_totals_milli", {}) or {}
    usage = pool.group_usage(directory.groups_of(pool.build_holders()) if directory is not None else None)
    default_milli = pool.quotas.limits_for([]).quota_milli
    out = []
    for g in sorted(set(overrides) | set(totals)):
        quota = (overrides.get(g) or {}).get("quota")
        quota_milli = parse_gpus(quota) if quota is not None else default_milli
        out.append(
            {
                "name": g,
                "quota": format_gpus(quota_milli),
                "own_quota": quota is not None,
                "used_milli": usage.get(g, 0),
                "used": format_gpus(usage.get(g, 0)),
                "total_milli": totals.get(g),
                "total": format_gpus(totals[g]) if g in totals else "",
            }
        )
    return out
