"""The Kubernetes back-end of the training pool: each job becomes a batch/v1 Job.

The cluster's scheduler (KAI-Scheduler, or Kueue) owns queueing, guarantees, reclaim and
placement, with the queues the gpupool chart renders from the same project table; the hub
validates a submission, records it, creates the Job and mirrors what the controller's watch
sees into the job row, so the REST API, widgets and admin page work as in the embedded mode.

Never twice: a job is created on the cluster once (Job names are the job ids, creation is
idempotent). Its code is snapshotted into the job's folder under TrainPool.jobs_root first, so
a row the hub had not yet sent when it died is sent after a restart; once the cluster holds the
Job and its code, the folder is removed.
"""

from __future__ import annotations

import json
import logging
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kubernetes_asyncio.client.exceptions import ApiException

from gpupool.alloc.manager import PoolManager
from gpupool.kube import budget_hold, pod_spans
from gpupool.kube.controller import KubeJobController
from gpupool.kube.home_mount import HomeUnavailable, home_problem
from gpupool.kube.job_namespace import owner_namespace, template_problem
from gpupool.kube.job_spec import TrainJobSpec
from gpupool.kube.kai_version import KaiVersion, detect, elastic_refusal, parse_version
from gpupool.kube.objects import queue_name
from gpupool.kube.pod_logs import MIB, KeptLogs
from gpupool.kube.pool_objects import kai_shard, pool_queue_name, pool_term, shard_problem
from gpupool.kube.status import FINAL, JobStatus
from gpupool.pool import InvalidRequest
from gpupool.pool.pool_quotas import queue_pool
from gpupool.store import TrainJob
from gpupool.train.backend import JobLog
from gpupool.train.book import JobBook
from gpupool.train.config import TrainPool
from gpupool.train.folders import user_jobs_folder
from gpupool.train.idle import IdleClock
from gpupool.train.request import JobRequest
from gpupool.vocab.states import Intent, JobEvent, JobState, ObservedState, PreemptCause

if TYPE_CHECKING:
    from gpupool.train.service import TrainingService

log = logging.getLogger("gpupool.train")
SUBMITTING = "submitting to Kubernetes"


class KubeTrainingService(JobBook):
    """The Kubernetes back-end (a gpupool.train.backend.TrainingBackend): the cluster's scheduler
    places jobs, so there is no `local` one."""

    local: TrainingService | None = None

    def __init__(
        self,
        pool: PoolManager,
        cfg: TrainPool,
        api_client: Any,
        backend: Any = None,
        idle_util_pct: float | None = None,
        gpu_use: Callable[[list[tuple[TrainJob, list[str]]]], dict[str, float | None]] | None = None,
        holds: Callable[[list[TrainJob]], dict[str, str]] | None = None,
    ) -> None:
        super().__init__(pool, cfg, holds)
        self.image = cfg.kube_image()
        if not self.image:
            raise ValueError(
                "c.TrainPool.image must name the container image of train jobs on Kubernetes"
                " (or c.KubeSpawner.image the workspaces', which they then share)"
            )
        self.opts = cfg.job_options()
        for node_pool in self.pools.values():  # a pool that cannot be said on a cluster stops the hub here
            pool_term(node_pool, self.opts.node_pool_label)
        # KAI: node pools are scheduling shards, a job goes to one (pool_objects.kai_shard)
        self.shards = bool(getattr(backend, "pools_are_shards", False))
        if self.shards:
            problems = [why for p in self.projects.values() if (why := shard_problem(p))]
            if problems:
                raise ValueError("; ".join(problems))
        self.api_client = api_client
        self.kai: KaiVersion | None = None  # which KAI runs (elastic jobs need v0.14.1+), read at start
        if self.opts.user_namespace_template:  # a job goes where its owner's workspace goes
            why = template_problem(self.opts.user_namespace_template, self.opts.slug_scheme)
            if why:
                raise ValueError(why)
        if self.opts.home_claim:  # names the hub cannot expand for a job stop it here, not a job
            o = self.opts
            why = home_problem(
                o.home_claim, o.home_pvc_template, o.home_sub_path, o.home_mount_path, o.slug_scheme
            )
            if why:
                raise ValueError(f"c.TrainPool.home_mount: {why}")
        self.controller = KubeJobController(
            api_client, self.opts, backend, on_change=self._on_change, namespace_of=self.namespace_of
        )
        # each job's log, kept on the hub's storage from its pods' streams (pod_logs.py)
        self.kept: KeptLogs | None = (
            KeptLogs(
                cfg.kube_logs_dir,
                cfg.max_log_mib * MIB,
                api_client,
                self.opts.namespace,
                cfg.kube_log_streams,
            )
            if cfg.kube_logs_dir
            else None
        )
        self.unsent: set[str] = set()  # rows whose Job the cluster has not taken yet
        # idle train jobs (projects with idle_gpu_s): GPU utilization per job id from the node
        # agents' per-pod samples (gpupool.wiring.setup.kube_job_gpu_use), None when unknown
        self.gpu_use = gpu_use
        self.idle_rules = cfg.idle_rules(idle_util_pct)  # the idle culler's threshold (set-up)
        self.idle = IdleClock()

    async def start(self) -> None:
        """Follow the cluster, then settle rows that changed while the hub was down."""
        await self.controller.start()
        self.adopt_after_restart()
        if self.shards:
            self.kai = await self.kai_version()
            log.info("KAI-Scheduler %s", self.kai.text or f"version unknown: {self.kai.error}")

    async def kai_version(self) -> KaiVersion:
        """The KAI version as configured (the chart's kai.version), else read from the cluster."""
        if self.opts.kai_version:
            found = parse_version(self.opts.kai_version)
            return KaiVersion(
                found,
                self.opts.kai_version,
                "" if found else f"kai_version {self.opts.kai_version!r} is not a version",
            )
        return await detect(self.api_client, self.opts.kai_namespace)

    async def check_elastic(self) -> None:
        """Refuse an elastic job where the cluster cannot gang-schedule it (InvalidRequest: 400).
        A KAI found too old or unknown is read again first: it may have been upgraded since."""
        if not self.shards:
            raise InvalidRequest(
                "elastic jobs (min_gpus) on Kubernetes need KAI-Scheduler's gang scheduling;"
                f" this hub's train jobs use GPU sharing '{self.cfg.sharing()}', whose"
                " scheduler starts each pod on its own: submit a fixed-size job"
            )
        if self.kai is None or not self.kai.elastic:
            self.kai = await self.kai_version()
        why = elastic_refusal(
            self.kai,
            f" (deployment {self.opts.kai_namespace}/pod-grouper)"
            if not self.opts.kai_version
            else " (the chart's kai.version)",
        )
        if why:
            raise InvalidRequest(why)

    async def stop(self) -> None:
        await self.controller.stop()
        if self.kept is not None:
            await self.kept.stop()

    # --- changes from the API -------------------------------------------------
    async def submit(self, job: JobRequest, now: float | None = None) -> TrainJob:
        """An elastic job (`job.min_gpus`) runs one pod per GPU (KAI's min-member). For a project with a guarantee per pool, the pure core picks
        the pool whose queue it waits in (gpupool.pool.pool_quotas.queue_pool); on KAI a job of
        another project with pools goes to the first of them (one shard per job). The job's
        container runs its code with the image's `python`; a notebook's executed copy is kept
        beside the checkpoints (the working folder is not kept)."""
        if job.min_gpus:
            await self.check_elastic()
        if self.opts.home_claim:  # a home the job cannot mount: said now, not by a failed job
            try:
                await self.controller.home_node(job.owner)
            except HomeUnavailable as err:
                raise InvalidRequest(f"the job cannot mount your home: {err}") from None
        chosen = self.queue_pool(job.project, job.pools, job.least_milli)
        command = job.code.command_line("python", self.opts.checkpoint_dir)
        row = self._record_new(job, command, now, message=SUBMITTING, pools=(chosen,) if chosen else None)
        self.unsent.add(row.id)
        await self._send(row.id)
        return self.known_job(row.id)

    def queue_pool(self, project: str, pools: tuple[str, ...], milli: int) -> str | None:
        """The pool whose queue a job of a project with a guarantee per pool waits in (None
        otherwise), from what the project's unfinished jobs already hold or wait for there."""
        p = self.projects[project]
        if not p.pool_guarantees:
            return kai_shard(p, pools, None) if self.shards else None
        used: dict[str, int] = {}
        rows = self.jobs(project=project)
        where = {r.id: r.pools[0] for r in rows if r.pools}
        for row in rows:
            if row.state not in FINAL and row.id in where:
                used[where[row.id]] = used.get(where[row.id], 0) + row.num_gpu * row.gpu_milli
        try:
            return queue_pool(p, pools, used, milli)
        except ValueError as err:
            raise InvalidRequest(str(err)) from None

    def _placement_of(self, row: TrainJob) -> dict[str, Any]:
        """The spec's pools, queue pool and elastic minimum, from what submit recorded."""
        names, min_gpus = tuple(row.pools), row.min_gpus
        project = self.projects.get(row.project)
        names = names or (project.pools if project is not None else ())
        per_pool = project is not None and bool(project.pool_guarantees)
        if self.shards:  # KAI: the job's one shard, recorded at submission
            names = names[:1]
        return {
            "pools": tuple(self.pools[n] for n in names if n in self.pools),
            "queue_pool": names[0] if (per_pool or self.shards) and names else "",
            "min_gpus": min_gpus,
        }

    async def _send(self, job_id: str) -> None:
        row = self.known_job(job_id)
        folder = Path(row.workdir)
        files = {f.name: f.read_bytes() for f in folder.iterdir() if f.is_file()} if folder.is_dir() else {}
        spec = TrainJobSpec.from_train_job(
            row, self.image, files=tuple(sorted(files)), **self._placement_of(row)
        )
        try:
            await self.controller.submit(spec, files)
        except HomeUnavailable as err:  # since submitted: the owner's server stopped
            self._fail_unsent(row, f"the job cannot mount its owner's home: {err}")
            return
        except ApiException as err:
            if err.status and 400 <= err.status < 500 and err.status not in (408, 429):
                # the cluster refuses it (invalid, forbidden by a ResourceQuota...): say why
                self._fail_unsent(row, f"Kubernetes refused the Job ({err.status}): {_reason(err)}")
                return
            log.warning("could not create the Job of %s (%s); retrying", job_id, err.status)
            self._set(job_id, message=f"{SUBMITTING} (retrying: {err.status} {err.reason})")
            return
        except Exception as err:  # noqa: BLE001 - network: the tick retries
            log.warning("could not create the Job of %s: %s; retrying", job_id, err)
            self._set(job_id, message=f"{SUBMITTING} (retrying: {err})")
            return
        self.unsent.discard(job_id)
        self._drop_folder(row)  # the code is on the cluster now (its ConfigMap)
        row = self.known_job(job_id)
        if row.message.startswith(SUBMITTING):  # the watch may have said more already
            self._set(job_id, message=self._waiting(row))

    def _fail_unsent(self, row: TrainJob, message: str) -> None:
        """A job the cluster will never run: failed with the reason, its code folder gone."""
        self.unsent.discard(row.id)
        self._set(row.id, state=JobState.FAILED, finished=time.time(), message=message)
        self._drop_folder(row)

    def _drop_folder(self, row: TrainJob) -> None:
        """The job's folder on the hub's volume only carries its code until the cluster has it;
        then it goes (it was never cleaned, and filled the hub's volume). Only a folder directly
        in the owner's jobs_root is removed: a path from the database is not followed elsewhere."""
        folder = Path(row.workdir)
        root = user_jobs_folder(self.cfg.jobs_root, row.owner)
        if folder.parent == root and folder.is_dir() and not folder.is_symlink():
            shutil.rmtree(folder, ignore_errors=True)

    async def cancel(self, job_id: str, now: float | None = None, by: str = "") -> TrainJob:
        from gpupool.train.service import cancelled_by

        now = now if now is not None else time.time()
        who = cancelled_by(by, self.known_job(job_id).owner, now)
        if job_id in self.unsent:  # never reached the cluster
            self.unsent.discard(job_id)
            self._set(job_id, state=JobState.CANCELLED, finished=now, message=f"{who} while queued")
        else:
            await self.controller.cancel(job_id)
            row = self.known_job(job_id)
            if row.state not in FINAL:
                self._set(job_id, message=f"cancelling: {who}")
        return self.known_job(job_id)

    async def logs(self, row: TrainJob, tail: int, before: int | None = None) -> JobLog:
        """The last `tail` lines of the job's kept log, all its pods' output (before byte offset
        `before`, to page back); `before` in the answer is where the first line starts. Without
        one (kube_logs_dir empty, or nothing copied yet), the newest pod's own log while it exists."""
        kept = await self.kept.read(row.id, tail, before) if self.kept is not None else None
        lines, start = kept if kept is not None else await self.controller.logs(row.id, tail, before)
        if kept is None and not lines and self._log_removed(row):
            lines = [
                "gpupool: this job's log is no longer kept (the logs of finished jobs are removed"
                " after c.TrainPool.keep_finished_days)"
            ]
        return {"lines": lines, "before": start, "output_notebook": None}

    def _log_removed(self, row: TrainJob, now: float | None = None) -> bool:
        keep_s = self.cfg.keep_finished_days * 86400
        ended = row.finished if row.state in FINAL else None
        return bool(self.kept and keep_s and ended and (now or time.time()) - ended >= keep_s)

    async def remove_old_logs(self, now: float | None = None) -> list[str]:
        """Remove the kept logs of jobs finished more than c.TrainPool.keep_finished_days ago, as
        one machine removes their folders (the hub's volume is not filled by old logs)."""
        keep_s = self.cfg.keep_finished_days * 86400
        if self.kept is None or not keep_s:
            return []
        old = [r.id for r in self.jobs() if self._log_removed(r, now)]
        return await self.kept.remove(old) if old else []

    def wait_reason(self, row: TrainJob) -> str:
        """Why a queued job waits, as the cluster says it (its row's message: the queue, and the
        scheduler's own words from its pod's PodScheduled condition), never computed from the
        hub's nominal inventory."""
        return row.message if row.state == JobState.QUEUED else ""

    # --- the loop ------------------------------------------------------------
    async def tick(self, now: float | None = None) -> dict[str, object]:
        """Retry Jobs the cluster could not take yet, and stop idle ones; the cluster's
        scheduler does the rest."""
        sent = []
        for job_id in list(self.unsent):
            await self._send(job_id)
            if job_id not in self.unsent:
                sent.append(job_id)
        stopped = await self._stop_idle(now if now is not None else time.time())
        held, released = await self.hold_over_budget()
        return {"sent": sent, "idle_stopped": stopped, "budget_held": held, "budget_released": released}

    async def hold_over_budget(self) -> tuple[list[str], list[str]]:
        """Suspend the Jobs of queued jobs whose owner's GPU-hour budget is used up, and resume
        them once it has room (gpupool.kube.budget_hold decides; a running job is never held).
        The row's intent is written before the Job is patched: a hub that dies in between
        finishes it on its next pass. Not with Kueue, which suspends and resumes Jobs itself."""
        if self.holds is None or self.opts.kueue:
            return [], []
        # queued and running rows only (a held job is queued; one that runs lets go of any hold),
        # never the whole history of finished ones
        rows = [
            r
            for r in self.jobs(state=JobState.QUEUED) + self.jobs(state=JobState.RUNNING)
            if r.id not in self.unsent and r.id in self.controller.jobs
        ]
        if not rows:
            return [], []
        held = self.holds(rows)
        decided = budget_hold.plan(
            (
                budget_hold.JobFacts(
                    job_id=r.id,
                    queued=r.state == JobState.QUEUED,
                    hold_recorded=r.intent == Intent.BUDGET_HOLD,
                    suspended=budget_hold.held_by_budget(self.controller.jobs.get(r.id)),
                    running=self.controller.running(r.id),
                )
                for r in rows
            ),
            held,
        )
        by_id = {r.id: r for r in rows}
        for job_id in decided.hold:
            row = by_id[job_id]
            if row.intent != Intent.BUDGET_HOLD:
                self._set(job_id, intent=Intent.BUDGET_HOLD, message=budget_hold.HELD_MESSAGE)
                self.pool.store.record(
                    JobEvent.BUDGET_HOLD, f"job {job_id} {held[job_id]}", owner=row.owner, name=job_id
                )
            await self._patch_hold(job_id, True)
        for job_id in decided.release:
            row = by_id[job_id]
            if row.intent == Intent.BUDGET_HOLD:
                self._set(job_id, intent=Intent.NONE, message=self._waiting(row))
                self.pool.store.record(
                    JobEvent.BUDGET_RELEASE,
                    f"job {job_id} released: {row.owner}'s GPU-hour budget has room",
                    owner=row.owner,
                    name=job_id,
                )
            await self._patch_hold(job_id, False)
        return decided.hold, decided.release

    async def _patch_hold(self, job_id: str, hold: bool) -> None:
        try:
            await self.controller.hold(job_id, hold)
        except Exception as err:  # noqa: BLE001 - network: the row says what is wanted, the next tick retries
            log.warning("could not %s the Job of %s: %s", "suspend" if hold else "resume", job_id, err)

    async def record_usage(self, now: float | None = None) -> int:
        """List the train pods and record their GPU intervals (gpupool.kube.pod_spans): the
        train jobs' GPU-hours in the usage report. Returns how many spans changed."""
        # with user namespaces, every owner's namespace: the train pods' label at cluster scope
        where = "" if self.controller.cluster_wide else self.opts.namespace
        changed = await pod_spans.relist(
            self.pool.store,
            self.controller.core,
            where,
            pod_spans.readers_for(self.controller.backend),
            None if now is None else int(now),
            memory_of=self.gpu_memory_of,
            memory_mib=self.opts.device_memory_mib,
        )
        return len(changed)

    def namespace_of(self, job_id: str) -> str | None:
        """The namespace of the job's Job: its owner's (the hub's without user namespaces);
        None for a job this hub does not know."""
        row = self.job(job_id)
        if row is None:
            return None
        try:
            return owner_namespace(
                row.owner, self.opts.namespace, self.opts.user_namespace_template, self.opts.slug_scheme
            )
        except ValueError:
            return None

    def gpu_memory_of(self, node: str) -> int:
        """One GPU's memory on `node` from the hub's inventory (the GPU Operator's labels); 0 for
        a node it does not know: a `gpu-memory` share is then read against device_memory_mib."""
        try:
            gpus = self.pool.inventory.node(node).gpus
        except KeyError:
            return 0
        return gpus[0].memory_mib if gpus else 0

    def running_pods(self, job_id: str) -> list[str]:
        """The uids of the job's pods that run now (an elastic job has several)."""
        return [
            v.uid
            for v in self.controller.pods.get(job_id, {}).values()
            if v.phase == "Running" and not v.gone
        ]

    async def _stop_idle(self, now: float) -> list[str]:
        """The embedded rule (train/idle.py) on the node agents' samples: warn in the job's
        message and an event, then delete its Job; the intent is written first, so the job
        ends `failed` with "idle GPU" (also when the hub restarts in between)."""
        if self.gpu_use is None or not self.idle_rules:
            return []
        stopped = []
        rows = [r for r in self.jobs(state=JobState.RUNNING) if r.project in self.idle_rules]
        for r in rows:
            if r.intent == Intent.IDLE and r.id not in self.controller.cancel_requested:
                await self.controller.cancel(r.id)  # decided before a hub restart: carry it out
        rows = [r for r in rows if r.intent != Intent.IDLE]
        util = self.gpu_use([(r, self.running_pods(r.id)) for r in rows]) if rows else {}
        by_id = {r.id: r for r in rows}
        for job_id, verdict, idle in self.idle.step(
            {(r.id, r.runs): self.idle_rules[r.project] for r in rows}, util, now
        ):
            row, rule = by_id[job_id], self.idle_rules[by_id[job_id].project]
            if verdict == "warn":
                msg = (
                    f"its GPUs have been idle for {idle / 60:.0f} min: it will be stopped in"
                    f" {(rule.idle_s - idle) / 60:.0f} min unless it uses them"
                )
                self._set(job_id, message=f"warning: {msg}")
                self.pool.store.record(
                    JobEvent.IDLE_WARNING, f"job {job_id}: {msg}", owner=row.owner, name=job_id
                )
                continue
            self._set(job_id, intent=Intent.IDLE, message="stopping: idle GPU")
            self.pool.store.record(
                JobEvent.IDLE_STOP,
                f"job {job_id} of {row.project} stopped: idle GPU for {idle / 60:.0f} min",
                owner=row.owner,
                name=job_id,
            )
            await self.controller.cancel(job_id)
            stopped.append(job_id)
        return stopped

    def _on_change(self, job_id: str, st: JobStatus) -> None:
        row = self.job(job_id)
        if row is None:
            return  # a Job of another hub (or of an old database) in the same namespace
        if self.kept is not None:  # a pod that started: copy its log while it lasts
            pods = self.controller.pods.get(job_id, {}).values()
            self.kept.follow(job_id, pods, namespace=self.namespace_of(job_id) or "")
        now = time.time()
        # preempted: the Job makes a new pod that waits in its queue and resumes, as the
        # embedded runner requeues a preempted job
        state = JobState.QUEUED if st.state == ObservedState.PREEMPTED else JobState(st.state)
        message = st.message
        if row.intent == Intent.IDLE:  # the hub deleted its Job because its GPUs stayed idle
            state, message = (
                (JobState.FAILED, "idle GPU") if state in FINAL else (state, "stopping: idle GPU")
            )
        values: dict[str, object] = {
            "state": state,
            "message": message,
            "runs": max(row.runs, st.runs),
            "preemptions": max(row.preemptions, st.preemptions),
            "exit_code": st.exit_code,
        }
        if state == JobState.RUNNING and row.state != JobState.RUNNING:
            values["started"] = now
        if state in FINAL and row.finished is None:
            values["finished"] = now
        if state == JobState.QUEUED and st.unschedulable:  # the scheduler said why
            values["message"] = f"{self._waiting(row)}: {st.unschedulable}"
        elif state == JobState.QUEUED and st.message in ("", "waiting for GPUs in its queue"):
            values["message"] = self._waiting(row)
        self._set(job_id, **values)
        if state != row.state:
            kind = {
                JobState.RUNNING: JobEvent.RESUME if st.runs > 1 else JobEvent.START,
                JobState.QUEUED: JobEvent.PREEMPT,
            }.get(state, JobEvent.SUBMITTED)
            if kind == JobEvent.PREEMPT and st.preemptions <= row.preemptions:
                return  # still waiting for its first pod: not news
            cause = {"cause": PreemptCause.CLUSTER} if kind == JobEvent.PREEMPT else {}
            self.pool.store.record(
                kind,
                f"job {job_id} {state}: {st.message}".rstrip(": "),
                owner=row.owner,
                name=job_id,
                **cause,
            )

    def _waiting(self, row: TrainJob) -> str:
        queue = queue_name(row.project, row.owner, self.opts)
        pool = self._placement_of(row)["queue_pool"]
        return f"waiting for GPUs in queue {pool_queue_name(queue, pool) if pool else queue}"

    def adopt_after_restart(self) -> None:
        """Rows the hub was sending when it died are sent again (creation is idempotent);
        rows whose Job is gone from the cluster fail: never run twice."""
        for row in self.jobs():
            if row.state in FINAL or row.id in self.unsent:
                continue
            if self.controller.status(row.id) is not None:
                continue  # the watch knows it and keeps the row up to date
            if row.message.startswith(SUBMITTING):
                self.unsent.add(row.id)
            else:
                self._set(
                    row.id,
                    state=JobState.FAILED,
                    finished=time.time(),
                    message="its Job is gone from the cluster (deleted while the hub was down)",
                )


def _reason(err: ApiException) -> str:
    try:
        message = json.loads(err.body).get("message") if err.body else None
    except (TypeError, ValueError):
        message = None
    return str(message or err.reason)
