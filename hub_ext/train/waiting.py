"""Why a queued train job waits and when it was preempted, in plain words for its owner (the job monitor, the admin page).

`wait_reason` is pure: it reads the job's size, its project's guarantee, limit and use, the jobs
ahead of it and the free milli-GPU of every GPU; it decides nothing (the scheduler does).
`explain` gathers those figures from the training service and the pool.
"""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpupool.pool.pools import within
from gpupool.pool.units import MILLI_PER_GPU, gpus_number
from gpupool.vocab.states import HAS_RUN, JobEvent, JobState, PreemptCause

if TYPE_CHECKING:
    from gpupool.alloc.manager import PoolManager
    from gpupool.pool.training import Project
    from gpupool.store import TrainJob
    from gpupool.train.backend import TrainingBackend
    from gpupool.train.service import TrainingService


def _gpus(milli: int) -> str:
    return gpus_number(milli)


def wait_reason(
    num_gpu: int,
    gpu_milli: int,
    project: str,
    guarantee_milli: int,
    limit_milli: int,
    used_milli: int,
    ahead: int,
    gpu_free: Sequence[Sequence[int]],
) -> str:
    """`gpu_free[node][gpu]`: free milli-GPU of each GPU a train job may use; negative: none there."""
    need = num_gpu * gpu_milli
    ahead_text = "" if ahead <= 0 else f"; {ahead} job{'s' if ahead > 1 else ''} ahead"
    sizes = [sum(1 for f in node if f >= 0) for node in gpu_free]
    if num_gpu > max(sizes, default=0):
        return (
            f"waiting: no node has {num_gpu} GPUs (the largest has {max(sizes, default=0)}):"
            " it cannot start until you ask for fewer"
        )
    if 0 <= limit_milli < used_milli + need:
        return (
            f"waiting for GPUs: project {project} uses {_gpus(used_milli)} of its"
            f" {_gpus(limit_milli)}-GPU limit{ahead_text}"
        )
    fits = any(sum(1 for f in node if f >= gpu_milli) >= num_gpu for node in gpu_free)
    if fits:
        return f"waiting for its turn{ahead_text}" if ahead_text else "starting: GPUs are free"
    what = f"{num_gpu} free GPUs" if gpu_milli >= MILLI_PER_GPU else f"a GPU with {_gpus(gpu_milli)} free"
    if num_gpu == 1 and gpu_milli >= MILLI_PER_GPU:
        what = "a free GPU"
    if used_milli + need > guarantee_milli:
        return (
            f"waiting for GPUs: no node has {what}; project {project} uses {_gpus(used_milli)} of its"
            f" {_gpus(guarantee_milli)}-GPU guarantee, so it waits for idle GPUs{ahead_text}"
        )
    return (
        f"waiting: no node has {what}; within its guarantee, project {project} gets GPUs back from"
        f" jobs running beyond theirs{ahead_text}"
    )


def explain(training: TrainingBackend | TrainingService, row: TrainJob) -> str:
    """The wait reason of queued job `row`, as its back-end says it ("" if not queued). A cluster
    that schedules (Kubernetes) says it itself: the hub's inventory there is nominal, so a reason
    computed from it ("GPUs are free") would be made up."""
    if row.state != JobState.QUEUED or row.project not in training.projects:
        return ""
    return training.wait_reason(row)


def explain_here(training: TrainingService, row: TrainJob) -> str:
    """The wait reason of queued job `row` from the embedded scheduler's jobs and pool."""
    project = training.projects[row.project]
    jobs = training.jobs()
    active = [j for j in jobs if j.project == row.project and j.state in HAS_RUN]
    used = sum(j.total_milli for j in active)
    queued = [j.id for j in jobs if j.state == JobState.QUEUED]
    ahead = queued.index(row.id) if row.id in queued else 0
    view = training.train_view()
    if project.pool_guarantees:
        # a guarantee per pool: the pool whose guarantee the job fits, as the scheduler sees it
        pool, in_pool_used = _pool_of(training, project, [training.scheduler_job(j) for j in active], row)
        if pool is not None:
            mask = within(view, [training.pools[pool]])
            return wait_reason(
                row.num_gpu,
                row.gpu_milli,
                f"{row.project} (pool {pool})",
                dict(project.pool_guarantees)[pool],
                project.limit_milli,
                in_pool_used,
                ahead,
                mask.gpu_free.tolist(),
            )
    return wait_reason(
        row.num_gpu,
        row.gpu_milli,
        row.project,
        project.guarantee_milli,
        project.limit_milli,
        used,
        ahead,
        view.gpu_free.tolist(),
    )


def _pool_of(
    training: TrainingService, project: Project, running: list[Any], row: TrainJob
) -> tuple[str | None, int]:
    """The first of the project's pools where `row` is within that pool's guarantee, and what
    the project uses there; (None, 0) when it is within none (it borrows)."""
    from gpupool.pool.pool_quotas import in_pool

    inventory = training.pool.inventory
    for pool, guarantee in project.pool_guarantees:
        used = sum(j.milli for j in running if in_pool(training.pools.get(pool), inventory, j))
        if used + row.num_gpu * row.gpu_milli <= guarantee:
            return pool, used
    return None, 0


def _clock(epoch: float) -> str:
    return time.strftime("%H:%M", time.localtime(epoch))


def preemption_text(
    preempted_at: float,
    cause: str,
    reason: str,
    checkpoint_at: float | None,
    state: str,
    for_project: str = "",
) -> str:
    """The last preemption as one line: when, why (its `cause`, a PreemptCause, picks the words;
    `reason` is the scheduler's own), and where the job goes on from."""
    if cause == PreemptCause.GUARANTEE and for_project:
        why = f"so that project {for_project} gets its guarantee back"
    elif cause == PreemptCause.CONSOLIDATION:
        why = "to move it to another node so that a bigger job fits"
    elif reason:
        why = f"because {reason}"
    else:
        why = ""
    head = f"preempted at {_clock(preempted_at)} {why}".rstrip()
    again = state in (JobState.RUNNING, JobState.PREEMPTING, JobState.SUCCEEDED, JobState.FAILED)
    if checkpoint_at is not None and checkpoint_at <= preempted_at + 3600:
        verb = "resumed" if again else "resumes"
        return f"{head}; {verb} from the checkpoint saved at {_clock(checkpoint_at)}"
    return f"{head}; {'restarted' if again else 'restarts'} from the beginning: no checkpoint"


def last_preemption(pool: PoolManager, row: TrainJob) -> str:
    """The preemption line of job `row` from its last `preempt` event and its checkpoint folder."""
    if not row.preemptions:
        return ""
    events = pool.store.events(limit=1, kind=JobEvent.PREEMPT, name=row.id)
    if not events:
        return ""
    at = events[0].time.replace(tzinfo=dt.UTC).timestamp()
    data = events[0].data or {}
    cause, reason, project = (str(data.get(k) or "") for k in ("cause", "reason", "for_project"))
    if not cause:  # recorded before events said why as fields
        cause, reason, project = _legacy_cause(events[0].message.partition("preempted: ")[2])
    saved = [p.stat().st_mtime for p in Path(row.workdir, "checkpoint").glob("*") if p.is_file()]
    return preemption_text(at, cause, reason, max(saved) if saved else None, row.state, project)


def _legacy_cause(reason: str) -> tuple[str, str, str]:
    """(cause, reason, for_project) of a preempt event written before it had fields: from its words."""
    if reason.startswith("project ") and reason.endswith(" needs its guarantee"):
        return (
            PreemptCause.GUARANTEE,
            reason,
            reason.removeprefix("project ").removesuffix(" needs its guarantee"),
        )
    if reason.startswith("moved to "):
        return PreemptCause.CONSOLIDATION, reason, ""
    return "", reason, ""
