"""Creates train Jobs through kubernetes_asyncio and follows them with watches on Jobs and pods.

One watch per kind (label selector: gpupool's train jobs), each a list followed by a watch
from its resourceVersion, restarted on timeouts and relisted on 410 Gone, as client-go's
informers do. Every event updates a cache and recomputes the job's state (status.py);
`on_change(job_id, JobStatus)` hears each change.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from gpupool.gpu.sharing import SharingBackend
from kubernetes_asyncio import client, watch
from kubernetes_asyncio.client.exceptions import ApiException

from .job_spec import TrainJobSpec
from .objects import JOB_ID, SELECTOR, JobOptions, checkpoint_claim, code_config_map, name_of, train_job
from .status import FINAL, JobStatus, PodView, job_status, observe_pod

log = logging.getLogger("gpupool.kube")
OnChange = Callable[[str, JobStatus], Awaitable[None] | None]


class KubeJobController:
    def __init__(self, api_client: client.ApiClient, opts: JobOptions, backend: SharingBackend | None = None,
                 on_change: OnChange | None = None, watch_timeout_s: int = 60) -> None:
        self.batch = client.BatchV1Api(api_client)
        self.core = client.CoreV1Api(api_client)
        self.opts, self.backend, self.on_change = opts, backend, on_change
        self.watch_timeout_s = watch_timeout_s
        self.jobs: dict[str, dict] = {}  # job id -> Job object
        self.pods: dict[str, dict[str, PodView]] = {}  # job id -> pod uid -> view
        self.deleted: set[str] = set()
        self.cancel_requested: set[str] = set()
        self.statuses: dict[str, JobStatus] = {}
        self.synced = asyncio.Event()
        self._tasks: list[asyncio.Task] = []
        self._listed: set[str] = set()

    # --- commands ------------------------------------------------------------
    async def submit(self, spec: TrainJobSpec, files: dict[str, bytes] | None = None) -> dict:
        """Create the Job, its checkpoint claim (unless a shared one is configured) and its code
        (a ConfigMap), both owned by the Job. Idempotent: after a hub restart, resubmitting an
        existing job changes nothing."""
        if set(files or {}) != set(spec.files):
            raise ValueError("the files given must be the files the spec names")
        manifest = train_job(spec, self.opts, self.backend)
        ns = self.opts.namespace
        # the Job first: the claim and the code are owned by it (deleted with it); its pod
        # waits until they exist
        job = await _create_or_keep(self.batch.create_namespaced_job, ns, manifest)
        uid = (job.get("metadata") or {}).get("uid")
        if not uid:  # it existed already: ask for its uid
            uid = (await self.batch.read_namespaced_job(name_of(spec.id), ns)).metadata.uid
        if not self.opts.checkpoint_claim:
            await _create_or_keep(self.core.create_namespaced_persistent_volume_claim, ns,
                                  checkpoint_claim(spec, self.opts, uid))
        if files:
            await _create_or_keep(self.core.create_namespaced_config_map, ns,
                                  code_config_map(spec, self.opts, files, uid))
        self.statuses.setdefault(spec.id, JobStatus("queued", "submitted"))
        return job

    async def logs(self, job_id: str, tail: int) -> list[str]:
        """The last `tail` lines of the job's newest pod (empty before a pod exists or once it
        is gone: pod logs live as long as the pod)."""
        views = sorted((v for v in self.pods.get(job_id, {}).values() if not v.gone), key=lambda v: v.order)
        for view in reversed(views):
            try:
                text = await self.core.read_namespaced_pod_log(view.name, self.opts.namespace, tail_lines=tail)
            except ApiException as err:
                if err.status in (400, 404):  # not started yet, or already gone
                    continue
                raise
            return text.splitlines()[-tail:]
        return []

    async def cancel(self, job_id: str) -> None:
        """Delete the Job and its pods (the pod gets its grace period); the watch says cancelled."""
        self.cancel_requested.add(job_id)
        try:
            await self.batch.delete_namespaced_job(name_of(job_id), self.opts.namespace,
                                                   propagation_policy="Background")
        except ApiException as err:
            if err.status != 404:
                raise
        await self._update(job_id)

    def status(self, job_id: str) -> JobStatus | None:
        return self.statuses.get(job_id)

    # --- watches -------------------------------------------------------------
    async def start(self) -> None:
        self._tasks = [asyncio.create_task(self._follow("jobs", self.batch.list_namespaced_job)),
                       asyncio.create_task(self._follow("pods", self.core.list_namespaced_pod))]
        await self.synced.wait()

    async def stop(self) -> None:
        for t in self._tasks:
            t.cancel()
        for t in self._tasks:
            try:
                await t
            except (asyncio.CancelledError, Exception):  # noqa: BLE001 - shutting down
                pass
        self._tasks = []

    async def _follow(self, kind: str, list_fn: Callable[..., Any]) -> None:
        ns = self.opts.namespace
        rv: str | None = None
        delay = 0.1
        while True:
            try:
                if rv is None:
                    listing = await list_fn(ns, label_selector=SELECTOR, _preload_content=False)
                    body = await listing.json()
                    await self._relist(kind, body["items"])
                    rv = body["metadata"]["resourceVersion"]
                w = watch.Watch()
                async with w.stream(list_fn, ns, label_selector=SELECTOR, resource_version=rv,
                                    timeout_seconds=self.watch_timeout_s, allow_watch_bookmarks=True) as stream:
                    async for event in stream:
                        obj = event["raw_object"]
                        if event["type"] == "ERROR":
                            if obj.get("code") == 410:  # too old: list again
                                rv = None
                                break
                            raise ApiException(status=obj.get("code"), reason=obj.get("message"))
                        rv = obj["metadata"].get("resourceVersion", rv)
                        if event["type"] != "BOOKMARK":
                            await self._apply(kind, event["type"], obj)
                delay = 0.1
            except asyncio.CancelledError:
                raise
            except ApiException as err:
                if err.status == 410:
                    rv = None
                    continue
                log.warning("watch of %s failed (%s); retrying", kind, err.status)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 10)
            except Exception as err:  # noqa: BLE001 - network: keep following
                log.warning("watch of %s broke: %s; retrying", kind, err)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 10)

    async def _relist(self, kind: str, items: list[dict]) -> None:
        seen = set()
        for obj in items:
            seen.add(_job_id(obj))
            await self._apply(kind, "ADDED", obj)
        if kind == "jobs":  # Jobs deleted while nobody watched
            for job_id in set(self.jobs) - seen:
                await self._apply(kind, "DELETED", self.jobs[job_id])
        self._listed.add(kind)
        if self._listed >= {"jobs", "pods"}:
            self.synced.set()

    async def _apply(self, kind: str, event: str, obj: dict) -> None:
        job_id = _job_id(obj)
        if not job_id:
            return
        if kind == "jobs":
            if event == "DELETED":
                self.deleted.add(job_id)
            else:
                self.jobs[job_id] = obj
                self.deleted.discard(job_id)
        else:
            views = self.pods.setdefault(job_id, {})
            uid = obj["metadata"].get("uid", "")
            views[uid] = observe_pod(views.get(uid), obj, deleted=event == "DELETED", order=len(views))
        await self._update(job_id)

    async def _update(self, job_id: str) -> None:
        old = self.statuses.get(job_id)
        new = job_status(self.jobs.get(job_id), self.pods.get(job_id, {}).values(),
                         cancel_requested=job_id in self.cancel_requested, job_deleted=job_id in self.deleted)
        if old is not None and old.state in FINAL and new.state != old.state:
            return  # a final state stays (the Job's later cleanup is not news); its details may still come
        if job_id not in self.jobs and job_id not in self.deleted and job_id not in self.cancel_requested:
            return  # pods seen before their Job: wait for it
        if new == old:
            return
        self.statuses[job_id] = new
        log.info("train job %s: %s %s", job_id, new.state, new.message)
        if self.on_change is not None:
            result = self.on_change(job_id, new)
            if inspect.isawaitable(result):
                await result


def _job_id(obj: dict) -> str:
    return ((obj.get("metadata") or {}).get("labels") or {}).get(JOB_ID, "")


async def _create_or_keep(create: Callable[..., Any], ns: str, body: dict) -> dict:
    try:
        created = await create(ns, body)
        return created.to_dict() if hasattr(created, "to_dict") else created
    except ApiException as err:
        if err.status != 409:
            raise
        log.info("%s %s exists already: kept", body["kind"], body["metadata"]["name"])
        return body
