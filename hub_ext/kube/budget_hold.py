"""Which train Jobs a GPU-hour budget holds or releases on Kubernetes: pure, no I/O, no clock.

On one machine a queued job whose owner is over budget simply is not started
(gpupool.usage.service.UsageService.held_jobs). On Kubernetes the cluster's scheduler starts it,
so the hub suspends the Job (`spec.suspend: true`: the Job controller keeps no pod, KAI has
nothing to place) and resumes it (`suspend: false`) once the budget has room again: an admin's
top-up, or the window sliding past old usage. A budget never stops a running job: a Job with a
running pod is never suspended by it.

The hold is written in the job's row (Intent.BUDGET_HOLD) before the Job is patched, and the
patch labels the Job (HELD_LABEL), so either half left by a hub that died in between is finished
by the next pass: `plan` reads both.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

HELD_LABEL = "gpupool.io/held"  # on a Job the hub suspended: why (gpupool.kube.status reads it)
BUDGET = "budget"
HELD_MESSAGE = "held: over budget; it starts once the budget has room (or an admin tops it up)"


@dataclass(frozen=True)
class JobFacts:
    """What the hub knows of one unfinished train job whose Job the cluster holds."""

    job_id: str
    queued: bool  # its row says queued (not running, not stopping)
    hold_recorded: bool  # its row's intent is Intent.BUDGET_HOLD
    suspended: bool  # its Job, as the watch last saw it, is suspended by the budget (HELD_LABEL)
    running: bool  # a pod of it runs (the row may not have caught up yet)


@dataclass(frozen=True)
class Plan:
    hold: list[str] = field(default_factory=list)  # record the hold (if not yet), then suspend
    release: list[str] = field(default_factory=list)  # clear the hold, then resume


def plan(jobs: Iterable[JobFacts], held: Mapping[str, str]) -> Plan:
    """`held`: the queued jobs whose owner's budget is used up (job id -> why). A job is held
    while it is queued and listed there; one with a running pod is never newly held (a pod that
    started before its row said so is running work); one already held stays held, whatever a
    stale pod view says. Everything else that carries either half of a hold is released."""
    out = Plan()
    for j in jobs:
        was_held = j.hold_recorded or j.suspended
        want = j.queued and j.job_id in held and (was_held or not j.running)
        if want and not (j.hold_recorded and j.suspended):
            out.hold.append(j.job_id)
        elif not want and was_held:
            out.release.append(j.job_id)
    return out


def held_by_budget(job: Mapping[str, Any] | None) -> bool:
    """A Job the hub suspended for a GPU-hour budget (not Kueue's suspension)."""
    meta = (job or {}).get("metadata") or {}
    spec = (job or {}).get("spec") or {}
    return bool(spec.get("suspend")) and (meta.get("labels") or {}).get(HELD_LABEL) == BUDGET


def suspend_patch(hold: bool) -> dict[str, object]:
    """The merge patch that holds (or releases) a Job: suspended and labelled in one write."""
    return {
        "metadata": {"labels": {HELD_LABEL: BUDGET if hold else None}},
        "spec": {"suspend": hold},
    }
