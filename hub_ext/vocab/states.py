"""The words a train job's life is told in: its state, the hub's intent for its run, the kinds of
its events and why it was preempted. String-valued enums, stored in the database as the same
strings they always were (no migration), compared and serialised as plain strings.

Pure and stdlib-only: the notebook widgets import it too.
"""

from __future__ import annotations

from enum import StrEnum

__all__ = [
    "OBSERVED_FINAL",
    "FINISHED",
    "HAS_RUN",
    "UNFINISHED",
    "ObservedState",
    "Intent",
    "JobEvent",
    "JobState",
    "PreemptCause",
]


class JobState(StrEnum):
    """A train job's state in the database (`TrainJob.state`) and in the REST API."""

    QUEUED = "queued"
    RUNNING = "running"
    PREEMPTING = "preempting"  # its run was told to stop; it is requeued or ends by its intent
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"


# Not ended yet: it may still run (the API's "active" jobs, the cancel button, limits on counts)
UNFINISHED = frozenset({JobState.QUEUED, JobState.RUNNING, JobState.PREEMPTING})
# A run of it exists (a process or pods) that holds GPUs: running, or stopping
HAS_RUN = frozenset({JobState.RUNNING, JobState.PREEMPTING})
FINISHED = frozenset({JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED})


class Intent(StrEnum):
    """What the hub decided to do to the current run (`TrainJob.intent`), written before it acts,
    so that a restarted hub carries it out; it also says why the job ended."""

    NONE = ""  # a preemption (requeue), or nothing decided
    CANCEL = "cancel"
    MAX_RUNTIME = "max-runtime"
    IDLE = "idle"  # its GPUs stayed idle past its project's idle_gpu_s
    DISK_LIMIT = "disk-limit"  # its folder grew over c.TrainPool.max_job_folder_mib
    # queued and held by its owner's GPU-hour budget: on Kubernetes its Job is suspended (no pod)
    # until the budget has room (gpupool.kube.budget_hold); never set on a job that runs
    BUDGET_HOLD = "budget-hold"


class JobEvent(StrEnum):
    """The kinds of the events a train job records (`Event.kind`, the admin page's history)."""

    SUBMITTED = "job"  # also a Kubernetes state change without a kind of its own
    START = "start"
    RESUME = "resume"
    PREEMPT = "preempt"
    REQUEUE = "requeue"
    CANCEL = "cancel"
    FAIL = "fail"
    RESERVE = "reserve"
    IDLE_WARNING = "idle-warning"
    IDLE_STOP = "idle-stop"
    DISK_LIMIT = "disk-limit"
    FOLDER_REMOVED = "folder-removed"
    BUDGET_HOLD = "budget-hold"  # a queued job held by its owner's GPU-hour budget (Kubernetes: suspended)
    BUDGET_RELEASE = "budget-release"  # ... and let go: the budget has room again


class ObservedState(StrEnum):
    """A train Job's state as the Kubernetes controller's watch sees it (gpupool.kube.status);
    `preempted` becomes `queued` in the database (its new pod waits, then resumes)."""

    QUEUED = "queued"
    RUNNING = "running"
    PREEMPTED = "preempted"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"


OBSERVED_FINAL = frozenset({ObservedState.SUCCEEDED, ObservedState.FAILED, ObservedState.CANCELLED})


class PreemptCause(StrEnum):
    """Why a run was stopped to go back to the queue: the `cause` field of its `preempt` event
    (the words for its owner are chosen from it, never parsed back out of the message)."""

    GUARANTEE = "guarantee"  # a project below its guarantee takes its GPUs back (`for_project`)
    PRIORITY = "priority"  # a job of higher priority in the same project
    CONSOLIDATION = "consolidation"  # moved to another node so that a bigger job fits
    RESIZE = "resize"  # an elastic job shrunk or grown
    BUILD = "build"  # a build workspace needs its GPU
    CLUSTER = "cluster"  # the cluster's scheduler evicted its pod (Kubernetes)
    HUB_STOP = "hub-stop"  # the hub stopped, with c.TrainPool.stop_jobs_at_stop (gpupool up --stop-jobs)
