"""Creates train Jobs through kubernetes_asyncio and follows them with two followers.

Two followers (follow.py, after kubespawner's reflector; Jobs and pods labelled as gpupool's)
keep an up-to-date, trimmed copy of what the cluster holds: they list, watch, resume a watch
that timed out, and list again after a broken watch (a `410 Gone` included). The controller
reconciles level-triggered, the Kubernetes way: every `resync_s` it compares the reflectors'
copies with what it saw last (by resourceVersion), folds what changed into its job states
(status.py) and calls `on_change(job_id, JobStatus)` for each change. A Job missing from the
copy was deleted; a pod missing from it is gone.

Level-triggered means a pod that came and went between two passes is never seen; what the
rows need survives that: a preemption that began and ended between passes (the Job already
runs its next pod) is reported as `preempted` then `running`, in that order. A Job deleted
before its watch ever showed it (created, then the connection dropped) is caught too: a Job
this controller submitted and has not seen in the copy after `confirm_after_s` is read once
from the API server, and a 404 there means deleted.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from gpupool.gpu.sharing import SharingBackend
from gpupool.kube.budget_hold import suspend_patch
from gpupool.kube.follow import Follower, trim_job, trim_pod
from gpupool.kube.home_mount import HomeUnavailable, home_node, nodes_using
from gpupool.kube.job_namespace import namespace_labels, owner_namespace, train_policy, user_namespace
from gpupool.kube.job_spec import TrainJobSpec
from gpupool.kube.kueue import API as KUEUE_API
from gpupool.kube.kueue import local_queue
from gpupool.kube.objects import (
    JOB_ID,
    KUEUE_QUEUE,
    MANAGED_BY,
    JobOptions,
    checkpoint_claim,
    code_config_map,
    home_of,
    job_namespace,
    name_of,
    train_job,
)
from gpupool.kube.shapes import KubeObject
from gpupool.kube.status import FINAL, JobStatus, ObservedState, PodView, job_status, observe_pod
from gpupool.runners.safe_files import tail_text

LOG_READ_MAX = 16 << 20  # bytes of a pod's log read for one page
log = logging.getLogger("gpupool.kube")
OnChange = Callable[[str, JobStatus], None]  # told each new status; writes the job's row, never waits
# job id -> its owner's namespace (None: a job the hub does not know)
NamespaceOf = Callable[[str], str | None]


class KubeJobController:
    def __init__(
        self,
        api_client: client.ApiClient,
        opts: JobOptions,
        backend: SharingBackend | None = None,
        on_change: OnChange | None = None,
        watch_timeout_s: int = 60,
        resync_s: float = 0.5,
        confirm_after_s: float = 5.0,
        clock: Callable[[], float] = time.monotonic,
        namespace_of: NamespaceOf | None = None,
    ) -> None:
        self.api_client = api_client
        self.batch = client.BatchV1Api(api_client)
        self.core = client.CoreV1Api(api_client)
        self.opts, self.backend, self.on_change = opts, backend, on_change
        self.watch_timeout_s, self.resync_s = watch_timeout_s, resync_s
        self.confirm_after_s, self.clock = confirm_after_s, clock
        self.unseen: dict[str, float] = {}  # job id -> when submitted (or last read), not yet in the copy
        self.jobs: dict[str, KubeObject] = {}  # job id -> Job object (the last one seen, kept after deletion)
        self.pods: dict[str, dict[str, PodView]] = {}  # job id -> pod uid -> view (kept after it is gone)
        self.deleted: set[str] = set()
        self.cancel_requested: set[str] = set()
        self.statuses: dict[str, JobStatus] = {}
        self.synced = asyncio.Event()
        self.reflectors: dict[str, Follower] = {}
        self._seen: dict[str, str] = {}  # Job or pod uid -> resourceVersion folded in
        self._vanished: set[str] = set()  # pod uids gone from the copy (folded in once)
        self._task: asyncio.Task[object] | None = None
        # user namespaces (opts.user_namespace_template): each owner's Jobs in their own
        # namespace, followed with one watch per kind at cluster scope (label-selected): the
        # chart's ClusterRole grants list/watch there, and RBAC has no "namespaces labelled
        # gpupool.io/user" scope; a watch per namespace would need the namespaces listed (the
        # hub may only create them) and two watches per user
        self.cluster_wide = bool(opts.user_namespace_template)
        self.namespace_for = namespace_of
        self.where: dict[str, str] = {}  # job id -> the namespace its Job was made or seen in
        self.fenced: set[str] = set()  # user namespaces whose train NetworkPolicy exists
        self.queues_made: set[tuple[str, str]] = set()  # Kueue LocalQueues made in user namespaces

    # --- commands ------------------------------------------------------------
    async def submit(self, spec: TrainJobSpec, files: dict[str, bytes] | None = None) -> dict[str, object]:
        """Create the Job, its checkpoint claim (unless a shared one is configured) and its code
        (a ConfigMap), both owned by the Job. Idempotent: after a hub restart, resubmitting an
        existing job changes nothing."""
        if set(files or {}) != set(spec.files):
            raise ValueError("the files given must be the files the spec names")
        ns = job_namespace(spec, self.opts)
        node = ""
        if self.opts.home_claim:
            try:
                node = await self.home_node(spec.owner)
            except HomeUnavailable:
                # resubmitted after a hub restart: a Job made before keeps its pod's placement
                if not await self._exists(spec.id, ns):
                    raise
        manifest = train_job(spec, self.opts, self.backend, home_node=node)
        if ns != self.opts.namespace:
            await self._prepare_namespace(ns, spec.owner)
            if self.opts.kueue:  # the chart's LocalQueues are in the hub's namespace only
                await self._local_queue(ns, manifest["metadata"]["labels"][KUEUE_QUEUE], spec.project)
        self.where[spec.id] = ns
        # the Job first: the claim and the code are owned by it (deleted with it); its pod
        # waits until they exist
        job = await _create_or_keep(self.batch.create_namespaced_job, ns, manifest)
        uid = (job.get("metadata") or {}).get("uid")
        if not uid:  # it existed already: ask for its uid
            uid = (await self.batch.read_namespaced_job(name_of(spec.id), ns)).metadata.uid
        if not self.opts.checkpoint_claim:
            await _create_or_keep(
                self.core.create_namespaced_persistent_volume_claim,
                ns,
                checkpoint_claim(spec, self.opts, uid),
            )
        if files:
            await _create_or_keep(
                self.core.create_namespaced_config_map, ns, code_config_map(spec, self.opts, files, uid)
            )
        if spec.id not in self.jobs:
            self.unseen[spec.id] = self.clock()
        if spec.id not in self.statuses:  # news now: the next pass may already see it running
            await self._tell(spec.id, JobStatus(ObservedState.QUEUED, "waiting for GPUs in its queue"))
        return job

    async def home_node(self, owner: str) -> str:
        """Where a job of `owner` mounting their home must run ("" anywhere): the claim's access
        modes and the nodes of the pods that use it (home_mount.home_node). HomeUnavailable
        with the user's reason when it cannot be mounted (no such claim: no server made it)."""
        claim, _, _ = home_of(owner, self.opts)
        ns = owner_namespace(
            owner, self.opts.namespace, self.opts.user_namespace_template, self.opts.slug_scheme
        )
        try:
            pvc = await self.core.read_namespaced_persistent_volume_claim(claim, ns)
        except ApiException as err:
            if err.status == 404:
                raise HomeUnavailable(
                    f"your home ({ns}/{claim}) does not exist yet: start your server once, then submit"
                ) from None
            raise
        modes = (pvc.status and pvc.status.access_modes) or pvc.spec.access_modes or []
        nodes: list[str] = []
        if "ReadWriteMany" not in modes:  # the nodes matter: which pods mount it, where
            pods = await self.core.list_namespaced_pod(ns)
            nodes = nodes_using(self.api_client.sanitize_for_serialization(pods.items), claim)
        return home_node(claim, ns, modes, self.opts.home_read_only, nodes)

    async def _exists(self, job_id: str, ns: str) -> bool:
        try:
            await self.batch.read_namespaced_job(name_of(job_id), ns)
        except ApiException as err:
            if err.status == 404:
                return False
            raise
        return True

    async def _local_queue(self, ns: str, name: str, project: str) -> None:
        """Kueue's LocalQueue `name` in a user namespace, pointing at the project's ClusterQueue
        (the chart's, whose namespaceSelector admits every namespace), before the first Job that
        names it: a Job whose LocalQueue is missing would wait, inadmissible, with no reason
        the user can act on. Only the hub writes there (users may read their pods only), so a
        LocalQueue made for a project the hub admitted the user to is used by the hub's Jobs."""
        if (ns, name) in self.queues_made:
            return
        api = client.CustomObjectsApi(self.api_client)
        group, version = KUEUE_API.split("/")

        async def create(namespace: str, body: dict[str, Any]) -> Any:
            return await api.create_namespaced_custom_object(group, version, namespace, "localqueues", body)

        await _create_or_keep(create, ns, local_queue(name, ns, project))
        self.queues_made.add((ns, name))

    async def _prepare_namespace(self, ns: str, owner: str) -> None:
        """The owner's namespace before their first Job: made with kubespawner's labels (Pod
        Security's level among them) when no workspace made it yet, and the train pods'
        NetworkPolicy in it. A policy that cannot be made fails the submission (raised): the
        job must not run unfenced."""
        if ns in self.fenced:
            return
        if self.opts.user_namespace_labels:
            labels = namespace_labels(
                self.opts.user_namespace_labels, owner, self.opts.namespace, self.opts.slug_scheme
            )
            await _create_or_keep(
                lambda _ns, body: self.core.create_namespace(body), ns, user_namespace(ns, labels)
            )
        if self.opts.network_policy:
            net = client.NetworkingV1Api(self.api_client)
            await _create_or_keep(
                net.create_namespaced_network_policy, ns, train_policy(ns, self.opts.network_policy)
            )
        self.fenced.add(ns)

    def namespace(self, job_id: str) -> str:
        """Where the job's Job is: as made or seen, else its owner's, else the hub's."""
        if job_id in self.where:
            return self.where[job_id]
        ns = self.namespace_for(job_id) if self.namespace_for is not None else None
        return ns or self.opts.namespace

    def _ours(self, job_id: str, obj: KubeObject) -> bool:
        """An object is the job's only in the hub's namespace or its owner's: at cluster scope a
        Job or pod elsewhere carrying its label (made by someone else) must not speak for it."""
        ns = (obj.get("metadata") or {}).get("namespace") or self.opts.namespace
        if ns == self.opts.namespace or ns == self.where.get(job_id):
            return True
        return self.namespace_for is not None and ns == self.namespace_for(job_id)

    async def logs(self, job_id: str, tail: int, before: int | None = None) -> tuple[list[str], int]:
        """The last `tail` lines of the job's newest pod that end before byte offset `before`,
        and where the first of them starts (to page further back), as for a local job's log.
        Empty before a pod exists or once it is gone: pod logs live as long as the pod. The
        whole current log is read (the kubelet rotates it at its containerLogMaxSize, 10 MiB by
        default; at most LOG_READ_MAX here): offsets count from its start."""
        views = sorted((v for v in self.pods.get(job_id, {}).values() if not v.gone), key=lambda v: v.order)
        for view in reversed(views):
            try:
                text = await self.core.read_namespaced_pod_log(
                    view.name, self.namespace(job_id), limit_bytes=LOG_READ_MAX
                )
            except ApiException as err:
                if err.status in (400, 404):  # not started yet, or already gone
                    continue
                raise
            return tail_text((text or "").encode(), tail, before)
        return [], 0

    async def cancel(self, job_id: str) -> None:
        """Delete the Job and its pods (the pod gets its grace period); the watch says cancelled."""
        self.cancel_requested.add(job_id)
        try:
            await self.batch.delete_namespaced_job(
                name_of(job_id), self.namespace(job_id), propagation_policy="Background"
            )
        except ApiException as err:
            if err.status != 404:
                raise
        await self._update(job_id)

    async def hold(self, job_id: str, hold: bool) -> bool:
        """Suspend (hold) or resume the Job for a GPU-hour budget (gpupool.kube.budget_hold).
        False when the Job is gone (nothing left to hold); the watch tells the new state."""
        try:
            # a dict goes as a strategic merge patch: `null` removes the label, as in a merge patch
            await self.batch.patch_namespaced_job(
                name_of(job_id), self.namespace(job_id), suspend_patch(hold)
            )
        except ApiException as err:
            if err.status != 404:
                raise
            return False
        return True

    def running(self, job_id: str) -> bool:
        """A pod of the job runs, as the watch last saw it."""
        return any(v.phase == "Running" and not v.gone for v in self.pods.get(job_id, {}).values())

    def status(self, job_id: str) -> JobStatus | None:
        return self.statuses.get(job_id)

    # --- following the cluster ----------------------------------------------------
    async def start(self) -> None:
        """List Jobs and pods, fold them in, then keep following (returns once synced; until
        the API server answers, it keeps trying)."""
        delay = 0.1
        while True:
            try:
                await self._reflect()
                break
            except Exception as err:  # noqa: BLE001 - network: keep trying, as the reflector does
                log.warning("listing train Jobs on Kubernetes failed: %s; retrying in %.1f s", err, delay)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 10)
        await self.reconcile()
        self.synced.set()
        self._task = asyncio.create_task(self._follow())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except (asyncio.CancelledError, Exception):  # noqa: BLE001 - shutting down
                pass
            self._task = None
        for reflector in self.reflectors.values():
            await reflector.stop()
        self.reflectors = {}

    async def _reflect(self) -> None:
        for kind in ("jobs", "pods"):
            if kind not in self.reflectors:
                self.reflectors[kind] = await self._reflector(kind)

    async def _reflector(self, kind: str) -> Follower:
        """A trimmed copy of gpupool's Jobs or pods on our API client (follow.py: list in pages,
        watch, resume the watch where it ended; kubespawner's reflector kept whole objects and
        listed everything again at each watch timeout)."""
        method: Callable[..., object]
        if self.cluster_wide:
            method = (
                self.batch.list_job_for_all_namespaces
                if kind == "jobs"
                else self.core.list_pod_for_all_namespaces
            )
        else:
            method = self.batch.list_namespaced_job if kind == "jobs" else self.core.list_namespaced_pod
        follower = Follower(
            method,
            "" if self.cluster_wide else self.opts.namespace,
            f"{MANAGED_BY}=gpupool",
            trim_job if kind == "jobs" else trim_pod,
            watch_timeout_s=self.watch_timeout_s,
            kind=f"train {kind}",
        )
        await follower.start()
        return follower

    async def _follow(self) -> None:
        while True:
            await asyncio.sleep(self.resync_s)
            try:
                await self._reflect()
                await self.reconcile()
            except asyncio.CancelledError:
                raise
            except Exception as err:  # noqa: BLE001 - network or a bad object: next pass
                log.warning("reconciling train Jobs failed: %s", err)

    async def reconcile(self) -> None:
        """One level-triggered pass: what changed in the reflectors' copies since the last one."""
        jobs, pods = (list(self.reflectors[k].resources.values()) for k in ("jobs", "pods"))
        changed: set[str] = set()
        present: set[str] = set()
        for obj in jobs:
            job_id = _job_id(obj)
            if not job_id or not self._ours(job_id, obj):
                continue
            present.add(job_id)
            self.where[job_id] = (obj.get("metadata") or {}).get("namespace") or self.opts.namespace
            if self._fresh(obj) or job_id in self.deleted:
                self.jobs[job_id] = obj
                self.deleted.discard(job_id)
                changed.add(job_id)
        for job_id in set(self.jobs) - present - self.deleted:  # deleted (maybe while nobody watched)
            self.deleted.add(job_id)
            changed.add(job_id)
        changed |= await self._confirm_unseen(present)
        live: set[str] = set()
        for obj in pods:
            job_id, uid = _job_id(obj), (obj.get("metadata") or {}).get("uid", "")
            if not job_id or not uid or not self._ours(job_id, obj):
                continue
            live.add(uid)
            if self._fresh(obj):
                views = self.pods.setdefault(job_id, {})
                views[uid] = observe_pod(views.get(uid), obj, order=len(views))
                changed.add(job_id)
        for job_id, views in self.pods.items():
            for uid, view in views.items():
                if uid not in live and uid not in self._vanished:
                    # last seen running, then gone without an end we saw: evicted (a pass
                    # missed its DisruptionTarget, or its exit after a bare delete: a pod seen
                    # only with its deletionTimestamp counts too), as the Job's replacement pod
                    # will show; not when the hub itself deleted it (cancel) or its Job went
                    self._vanished.add(uid)
                    ours = job_id in self.cancel_requested or job_id in self.deleted
                    why = view.disrupted or (
                        "its pod was deleted" if view.phase == "Running" and not ours else ""
                    )
                    views[uid] = replace(view, gone=True, disrupted=why)
                    self._seen.pop(uid, None)
                    changed.add(job_id)
        for job_id in sorted(changed):
            await self._update(job_id)

    async def _confirm_unseen(self, present: set[str]) -> set[str]:
        """Jobs submitted here that the copy has not shown for `confirm_after_s`: read each from
        the API server (a consistent read, not the watch cache); gone there means deleted."""
        deleted: set[str] = set()
        for job_id, since in list(self.unseen.items()):
            if job_id in present or job_id in self.jobs:
                del self.unseen[job_id]
                continue
            if self.clock() - since < self.confirm_after_s:
                continue
            self.unseen[job_id] = self.clock()  # still missing next time: read it again then
            try:
                await self.batch.read_namespaced_job(name_of(job_id), self.namespace(job_id))
            except Exception as err:  # noqa: BLE001 - the pass's other news must not be lost
                if not (isinstance(err, ApiException) and err.status == 404):
                    log.warning("reading train Job %s failed: %s; trying again later", job_id, err)
                    continue
                del self.unseen[job_id]
                self.deleted.add(job_id)
                deleted.add(job_id)
        return deleted

    def _fresh(self, obj: KubeObject) -> bool:
        meta = obj.get("metadata") or {}
        uid, rv = meta.get("uid", ""), meta.get("resourceVersion", "")
        if self._seen.get(uid) == rv:
            return False
        self._seen[uid] = rv
        return True

    async def _update(self, job_id: str) -> None:
        old = self.statuses.get(job_id)
        new = job_status(
            self.jobs.get(job_id),
            self.pods.get(job_id, {}).values(),
            cancel_requested=job_id in self.cancel_requested,
            job_deleted=job_id in self.deleted,
        )
        if old is not None and old.state in FINAL and new.state != old.state:
            return  # a final state stays (the Job's later cleanup is not news); its details may still come
        if job_id not in self.jobs and job_id not in self.deleted and job_id not in self.cancel_requested:
            return  # pods seen before their Job: wait for it
        if new == old:
            return
        if (
            old is not None
            and old.state != ObservedState.PREEMPTED
            and new.preemptions > old.preemptions
            and new.state not in (ObservedState.PREEMPTED, ObservedState.CANCELLED)
        ):
            # preempted and already resumed (or ended) between two passes: the preemption is news too
            await self._tell(
                job_id,
                replace(
                    new,
                    state=ObservedState.PREEMPTED,
                    runs=old.runs,
                    message="preempted; it resumes from its checkpoint",
                ),
            )
            old = self.statuses[job_id]
        if (
            old is not None
            and new.state in FINAL
            and old.state != ObservedState.RUNNING
            and new.runs > old.runs
        ):
            # (re)started and ended between two passes (the end now comes from the pod, before the
            # Job's condition): the run is news too, before its end
            await self._tell(
                job_id,
                replace(
                    new,
                    state=ObservedState.RUNNING,
                    exit_code=old.exit_code,
                    message="resumed from its checkpoint" if new.preemptions else "",
                ),
            )
        await self._tell(job_id, new)

    async def _tell(self, job_id: str, new: JobStatus) -> None:
        self.statuses[job_id] = new
        log.info("train job %s: %s %s", job_id, new.state, new.message)
        if self.on_change is not None:
            self.on_change(job_id, new)


def _job_id(obj: KubeObject) -> str:
    return ((obj.get("metadata") or {}).get("labels") or {}).get(JOB_ID, "")


async def _create_or_keep(create: Callable[..., Any], ns: str, body: dict[str, Any]) -> dict[str, Any]:
    try:
        created = await create(ns, body)
        return created.to_dict() if hasattr(created, "to_dict") else created
    except ApiException as err:
        if err.status != 409:
            raise
        log.info("%s %s exists already: kept", body["kind"], body["metadata"]["name"])
        return body
