"""A train Job and its pods -> gpupool's job state: pure, fed by the controller's watch.

States: queued (waiting for GPUs in its queue, suspended by Kueue, or held by a GPU-hour budget:
suspended by the hub), running, preempted
(its pod was evicted, or Kueue suspended the Job after it ran; a new pod resumes from the
checkpoint), succeeded, failed, cancelled.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace
from typing import TypedDict

from gpupool.kube.budget_hold import HELD_MESSAGE, held_by_budget
from gpupool.kube.shapes import JobSpec, KubeObject
from gpupool.vocab.exit_codes import PREEMPTED
from gpupool.vocab.states import OBSERVED_FINAL, ObservedState
from gpupool.vocab.states import ObservedState as S

STATES = tuple(ObservedState)
FINAL = OBSERVED_FINAL
UNSCHEDULABLE = (
    "unschedulable: "  # a queued job's message when its scheduler said why it waits (also a field)
)
REASON_MAX = 400  # characters of the scheduler's reason kept (KAI lists fit errors per node)


@dataclass(frozen=True, slots=True)  # one per train pod and Job: no __dict__ each
class PodView:
    """What the controller remembers of one pod of a Job, also after it is gone."""

    uid: str
    name: str
    phase: str = "Pending"
    ran: bool = False  # seen Running at least once
    disrupted: str = ""  # DisruptionTarget reason, when preempted or evicted
    gone: bool = False
    exit_code: int | None = None
    order: int = 0  # when the controller first saw it (creation timestamps have 1 s resolution)
    unschedulable: str = ""  # the scheduler's reason while it cannot place it (PodScheduled False)


@dataclass(frozen=True, slots=True)
class JobStatus:
    state: ObservedState
    message: str = ""
    runs: int = 0  # pods that ran
    preemptions: int = 0
    exit_code: int | None = None
    unschedulable: str = ""  # a queued job: why its scheduler cannot place it, in its own words


def observe_pod(prev: PodView | None, pod: KubeObject, deleted: bool = False, order: int = 0) -> PodView:
    """Fold one watch event of a pod into what is remembered of it."""
    meta, st = pod.get("metadata") or {}, pod.get("status") or {}
    view = prev or PodView(uid=meta.get("uid", ""), name=meta.get("name", ""), order=order)
    phase = st.get("phase") or view.phase
    ran = (
        view.ran
        or phase == "Running"
        or any(
            "running" in (c.get("state") or {}) or "terminated" in (c.get("state") or {})
            for c in st.get("containerStatuses") or []
        )
    )
    disrupted = view.disrupted
    for cond in st.get("conditions") or []:
        if cond.get("type") == "DisruptionTarget" and cond.get("status") == "True":
            disrupted = cond.get("reason") or "evicted"
    exit_code = view.exit_code
    for c in st.get("containerStatuses") or []:
        term = (c.get("state") or {}).get("terminated")
        code = term.get("exitCode") if term else None
        if code is not None:
            exit_code = int(code)
    if exit_code == PREEMPTED and not disrupted:  # saved its checkpoint on SIGTERM: the Job resumes it
        disrupted = "checkpointed and stopped"
    unschedulable = ""
    for cond in st.get("conditions") or []:  # KAI (and kube-scheduler) say here why a pod waits
        if cond.get("type") == "PodScheduled" and cond.get("status") == "False":
            unschedulable = " ".join(str(cond.get("message") or cond.get("reason") or "").split())[
                :REASON_MAX
            ]
    return replace(
        view,
        phase=phase,
        ran=ran,
        disrupted=disrupted,
        exit_code=exit_code,
        unschedulable=unschedulable,
        gone=view.gone or deleted or bool(meta.get("deletionTimestamp")),
    )


# a container's exit after SIGTERM (128 + 15): in a Job with a max runtime (activeDeadlineSeconds)
# it is the Job controller stopping it at the deadline, not an end of its own work. Read as an end,
# it raced the Job's DeadlineExceeded condition and a job past its max runtime said "exit code 143"
STOPPED_BY_SIGTERM = 143


def stopped_at_deadline(spec: JobSpec, pod: PodView) -> bool:
    """A pod of a Job with a max runtime that ended on SIGTERM: the deadline, not its work."""
    return (
        bool(spec.get("activeDeadlineSeconds"))
        and pod.phase == "Failed"
        and pod.exit_code == STOPPED_BY_SIGTERM
    )


def ended_by_pods(job: KubeObject | None, pods: list[PodView], live: list[PodView]) -> JobStatus | None:
    """The end the Job controller will write, read from the pods as soon as they show it (the
    Job's own Complete or Failed condition trails by seconds to a minute on a busy cluster).
    Only what follows from the Job's spec as train_job writes it: one pod at a time (done when
    it succeeds) or an elastic job (done when one worker succeeded and none is left); failed
    when more pods failed than its backoffLimit allows. A pod that was preempted (the
    DisruptionTarget condition, or the checkpoint helper's exit code) or deleted before it ended
    is never an end: the Job replaces it, or its condition says why it stopped."""
    if job is None:
        return None  # a Job's spec says what its pods mean: wait for it
    spec = job.get("spec") or {}
    parallelism, completions = spec.get("parallelism"), spec.get("completions")
    one_pod = parallelism in (None, 1) and completions in (None, 1)
    elastic = completions is None and isinstance(parallelism, int) and parallelism > 1
    # a pod deleted before it ended (cancel, max runtime, eviction) says nothing of the work
    succeeded = [p for p in pods if p.phase == "Succeeded" and not p.disrupted and not p.gone]
    if succeeded and (one_pod or (elastic and not live)):
        return JobStatus(S.SUCCEEDED)
    failures = [
        p
        for p in pods
        if p.phase == "Failed"
        and not p.disrupted
        and not p.gone
        and p.exit_code not in (None, 0)
        and not stopped_at_deadline(spec, p)
    ]
    limit = spec.get("backoffLimit")
    if one_pod and isinstance(limit, int) and failures and len(failures) > limit and not live:
        return JobStatus(S.FAILED, f"exit code {failures[-1].exit_code}")
    return None


class _Counts(TypedDict):
    """What every JobStatus of a job says beside its state."""

    runs: int
    preemptions: int
    exit_code: int | None


def job_status(
    job: KubeObject | None,
    pods: Iterable[PodView],
    cancel_requested: bool = False,
    job_deleted: bool = False,
) -> JobStatus:
    """The state of a train job from its Job (None before the watch saw it) and its pods."""
    pods = sorted(pods, key=lambda p: (p.order, p.name))
    runs = sum(p.ran for p in pods)
    preemptions = sum(bool(p.disrupted) for p in pods)
    exit_code = next((p.exit_code for p in reversed(pods) if p.exit_code is not None), None)
    counts: _Counts = {"runs": runs, "preemptions": preemptions, "exit_code": exit_code}
    conditions = {
        c.get("type"): c
        for c in ((job or {}).get("status") or {}).get("conditions") or []
        if c.get("status") == "True"
    }
    for kind in ("Complete", "SuccessCriteriaMet"):
        if kind in conditions:
            return JobStatus(S.SUCCEEDED, **counts)
    for kind in ("Failed", "FailureTarget"):
        if kind in conditions:
            if cancel_requested:
                return JobStatus(S.CANCELLED, "cancelled", **counts)
            reason = conditions[kind].get("reason", "")
            if reason == "DeadlineExceeded":
                message = "stopped at its max runtime"
            elif exit_code is not None:
                message = f"exit code {exit_code}"
            else:
                message = conditions[kind].get("message") or reason or "failed"
            return JobStatus(S.FAILED, message, **counts)
    if cancel_requested or job_deleted:
        live = [p for p in pods if not p.gone and p.phase in ("Pending", "Running")]
        if cancel_requested and live and not job_deleted:
            return JobStatus(
                S.RUNNING if any(p.phase == "Running" for p in live) else S.QUEUED, "cancelling", **counts
            )
        return JobStatus(
            S.CANCELLED, "cancelled" if cancel_requested else "its Job was deleted outside gpupool", **counts
        )
    if held_by_budget(job):
        # the hub suspended it while it waited, for its owner's GPU-hour budget: no pod, and
        # not a preemption (a budget never stops a running job; gpupool.kube.budget_hold)
        return JobStatus(S.QUEUED, HELD_MESSAGE, **counts)
    if ((job or {}).get("spec") or {}).get("suspend"):
        if runs:  # Kueue evicted it (reclaim, priority): it suspends the Job, which stops its pods
            return JobStatus(
                S.PREEMPTED,
                "preempted by Kueue; it resumes from its checkpoint when Kueue admits it again",
                **counts,
            )
        return JobStatus(S.QUEUED, "waiting for Kueue to admit it", **counts)
    live = [p for p in pods if not p.gone and not p.disrupted and p.phase in ("Pending", "Running")]
    ended = ended_by_pods(job, pods, live)
    if ended is not None:
        return replace(ended, **counts)
    if any(p.phase == "Running" for p in live):
        return JobStatus(
            S.RUNNING, "resumed from its checkpoint" if preemptions and runs > 1 else "", **counts
        )
    if any(p.phase == "Succeeded" and not p.disrupted for p in pods):
        return JobStatus(S.RUNNING, "finishing", **counts)  # the Job's Complete condition follows
    last = pods[-1] if pods else None
    if last is not None and (last.disrupted or last.gone) and not live:
        # deleted by someone else than the hub (a scheduler without the DisruptionTarget condition):
        # its exit code says soon whether it saved a checkpoint
        why = last.disrupted or "its pod was deleted"
        return JobStatus(S.PREEMPTED, f"preempted ({why}); it resumes from its checkpoint", **counts)
    if preemptions and live:
        return JobStatus(S.PREEMPTED, "preempted; waiting for GPUs to resume", **counts)
    if last is not None and not live and stopped_at_deadline((job or {}).get("spec") or {}, last):
        # stopped from outside in a Job with a max runtime: its DeadlineExceeded condition follows
        return JobStatus(S.RUNNING, "stopping", **counts)
    why = next((p.unschedulable for p in reversed(live) if p.unschedulable), "")
    if why:
        return JobStatus(S.QUEUED, UNSCHEDULABLE + why, unschedulable=why, **counts)
    return JobStatus(S.QUEUED, "waiting for GPUs in its queue", **counts)
