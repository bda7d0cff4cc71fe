"""When will a train job waiting in KAI-Scheduler's queues start, for the API, the job monitor
and JupyterLab's status bar: the Kubernetes back-end's counterpart of `gpupool.train.estimates`.

The snapshot is read from what the hub holds of the cluster on its event loop (the projects the
chart renders KAI's queues from, the job rows the controller's watch keeps up to date, the
cluster's GPUs in the inventory, the workspaces' GPUs); the forecast of KAI's order
(`gpupool.kube.kai_forecast`) runs in a thread, at most once per `ttl_s`, never twice at a time.

Not forecast (None, the job's wait reason stays KAI's own words): with Kueue (its own order),
with KAI node pools (each a shard with queues of its own), or queues per owner.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from sqlalchemy import select

from gpupool.kube.kai_forecast import KaiEstimate, KaiJob, KaiQueue, KaiSnapshot, forecast, go_duration
from gpupool.store import PodSpanRow
from gpupool.train.estimates import HISTORY, Estimates, clock_text, eta_text, run_history, stated_error
from gpupool.vocab.job_wire import JobEstimate
from gpupool.vocab.kinds import WorkloadKind
from gpupool.vocab.states import Intent, JobState

if TYPE_CHECKING:
    from gpupool.store import TrainJob
    from gpupool.train.backend import TrainingBackend
    from gpupool.train.kube_service import KubeTrainingService

BASIS = (
    "a forecast of KAI-Scheduler's order (queue guarantees, over-quota weights, priorities,"
    " reclaim) from the cluster's queues, nodes and jobs"
)


def kai_snapshot(svc: KubeTrainingService, now: float) -> KaiSnapshot | None:
    """What the forecast reads of the hub's copy of the cluster; None where KAI's order is not
    what decides or its queues are not the hub's projects (see the module's note)."""
    opts = svc.opts
    if opts.kueue or (svc.shards and svc.pools) or opts.queue != "{project}":
        return None
    rows = svc.jobs()
    queues = {
        name: KaiQueue(
            name,
            p.guarantee_milli,
            p.limit_milli,
            p.weight,
            p.priority,
            go_duration(opts.queue_min_runtime.get(name, "")),  # the chart's minRuntime
            f"department-{p.department}" if p.department in svc.departments else "",
        )
        for name, p in svc.projects.items()
    }
    # the departments' parent queues, named as the chart names them (templates/queues.yaml)
    parents = {
        f"department-{name}": KaiQueue(f"department-{name}", d.guarantee_milli, d.limit_milli)
        for name, d in svc.departments.items()
    }

    # where the running pods are: the open spans of the hub's relist of train pods (pod_spans)
    with svc.pool.store.session() as s:
        spans = list(s.scalars(select(PodSpanRow).where(PodSpanRow.end.is_(None))))
    placed: dict[str, list[tuple[str, int]]] = {}
    for span in spans:
        placed.setdefault(span.job, []).append((span.node, span.milli))

    def job(r: TrainJob) -> KaiJob:
        gpus = r.min_gpus or r.num_gpu  # KAI gang-schedules an elastic job's minimum
        return KaiJob(
            r.id,
            r.project,
            gpus * r.gpu_milli,
            priority=1 if r.priority > 0 else 0,  # the two priority classes train pods get
            submitted=r.submitted,
            started=r.started,
            max_runtime_s=r.max_runtime_s,
            label=f"job {r.id} of {r.project}",
            placed=tuple(placed.get(r.id, ())) if r.state == JobState.RUNNING else (),
            pod_milli=r.gpu_milli if r.min_gpus else 0,  # an elastic job: a pod per GPU
        )

    held = svc.holds([r for r in rows if r.state == JobState.QUEUED]) if svc.holds is not None else {}
    pending = [
        job(r)
        for r in rows
        if r.state == JobState.QUEUED and r.intent != Intent.BUDGET_HOLD and r.id not in held
    ]
    running = [job(r) for r in rows if r.state == JobState.RUNNING]
    history = run_history(rows)
    # each node's GPUs, less the workspaces': they hold theirs in KAI's queues too, and are
    # never preempted, so they are not for jobs
    nodes = {n.name: len(n.gpus) * 1000 for n in svc.pool.inventory.nodes}
    for a in svc.pool.store.allocations(kind=WorkloadKind.BUILD):
        if a.node in nodes:
            nodes[a.node] = max(0, nodes[a.node] - len(a.gpus) * a.gpu_milli)
    return KaiSnapshot(
        now,
        sum(nodes.values()),
        queues,
        running,
        pending,
        {p: sum(v) / len(v) for p, v in history.items()},
        parents=parents,
        nodes=nodes,
    )


class KaiEstimates:
    """The start estimates of jobs in KAI's queues, in the same JSON as the embedded ones."""

    def __init__(
        self,
        training: KubeTrainingService,
        ttl_s: float = 5.0,
        clock: Callable[[], float] = time.time,
        compute: Callable[[KaiSnapshot], dict[str, KaiEstimate]] = forecast,
        timer: Callable[[], float] = time.monotonic,
    ) -> None:
        """`compute`: the pure forecast (`gpupool.kube.kai_forecast.forecast`; a test's own);
        `timer` measures how long it took (a big cluster's takes seconds: it is then made at
        most once per ten times that, so the hub's CPU is not spent on it alone)."""
        self.training, self.ttl_s, self.clock, self.compute = training, ttl_s, clock, compute
        self.timer = timer
        self._ttl = ttl_s
        self._at = -1e18
        self._snap: KaiSnapshot | None = None
        self._estimates: dict[str, KaiEstimate] = {}
        self._queued: set[str] = set()  # the queued jobs the last computation saw (held ones too)
        self._first: dict[str, tuple[float, float]] = {}  # as the embedded ones: a later move is said
        self._flight: asyncio.Future[None] | None = None

    @property
    def available(self) -> bool:
        return True

    async def refresh(self, now: float, need: str = "") -> dict[str, KaiEstimate]:
        """Every waiting job's estimate, no older than `ttl_s` and, with `need`, made after that
        queued job was seen (one held by a budget is seen, and gets none). Never two at once."""
        for _ in range(2):
            if now - self._at < self._ttl and (not need or need in self._queued):
                break
            if self._flight is None:
                self._flight = asyncio.ensure_future(self._compute(now))
                await asyncio.shield(self._flight)
                break
            await asyncio.shield(self._flight)
        return self._estimates

    async def _compute(self, now: float) -> None:
        try:
            queued = {r.id for r in self.training.jobs(state=JobState.QUEUED)}
            snap = kai_snapshot(self.training, now)  # on the loop: the rows change under it
            began = self.timer()
            estimates = await asyncio.to_thread(self.compute, snap) if snap is not None else {}
            self._ttl = max(self.ttl_s, 10 * (self.timer() - began))
            self._snap, self._estimates, self._queued, self._at = snap, estimates, queued, now
            self._first = {k: v for k, v in self._first.items() if k in estimates}
        finally:
            self._flight = None

    async def for_job(self, row: TrainJob, now: float | None = None) -> JobEstimate | None:
        """{"start", "in_s", "error_s", "after", "basis", "reason", "text"} for a job waiting in
        KAI's queues; None when not queued, held by a budget, or not forecast here."""
        if row.state != JobState.QUEUED:
            return None
        now = self.clock() if now is None else now
        est = (await self.refresh(now, need=row.id)).get(row.id)
        if est is None or self._snap is None:
            return None
        runs = [r for r in self.training.jobs(project=row.project) if r.state == JobState.SUCCEEDED]
        basis = f"{BASIS}; " + (
            f"run times from the finished jobs of {row.project} ({min(len(runs), HISTORY)})"
            if row.project in self._snap.runtime_s
            else f"no finished job of {row.project} yet (1 h each)"
        )
        if est.start is None:
            return {
                "start": None,
                "in_s": None,
                "error_s": None,
                "after": "",
                "basis": basis,
                "reason": est.reason,
                "text": f"no start in sight: {est.reason}",
            }
        in_s = max(0.0, est.start - now)
        error_s = stated_error(in_s)
        text = f"{eta_text(est.start, in_s, est.after)}: {est.reason}"
        first = self._first.setdefault(row.id, (est.start, error_s))
        if abs(est.start - first[0]) > first[1]:
            later = "later" if est.start > first[0] else "earlier"
            text += (
                f"; {abs(est.start - first[0]) / 60:.0f} min {later} than first estimated"
                f" ({clock_text(first[0])}, give or take {first[1] / 60:.0f} min)"
            )
        return {
            "start": est.start,
            "in_s": in_s,
            "error_s": error_s,
            "after": est.after,
            "basis": basis,
            "reason": est.reason,
            "text": text,
        }


def start_estimates(training: TrainingBackend) -> Estimates | KaiEstimates:
    """The estimates of the hub's back-end: the embedded scheduler's forward simulation, or
    on Kubernetes the forecast of KAI's order (None-valued elsewhere: Estimates(None))."""
    if training.local is None:
        from gpupool.train.kube_service import KubeTrainingService  # only where it runs

        if isinstance(training, KubeTrainingService):
            return KaiEstimates(training)
    return Estimates(training.local)
