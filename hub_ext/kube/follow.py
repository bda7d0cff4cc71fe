"""Following train Jobs and their pods: list, then watch, keeping a trimmed copy of each.

Modelled on kubespawner's `NamespacedResourceReflector` (list, watch from the list's
resourceVersion, list again after an error), with three differences that matter at 2,000 Jobs
(benchmarks/kube: the hub grew from 166 to 408 MiB following them with kubespawner's):
- each object is kept trimmed to what the job states are made of (`trim_job`, `trim_pod`):
  names, labels, the Job's few spec fields, phases, conditions and exit codes; a pod or Job as
  the API server sends it (managedFields, the whole pod template) is many times that;
- the list is read in pages (`limit`), so a relist never holds every object at once;
- a watch that ends (its `timeout_seconds`) is resumed from the last resourceVersion seen,
  with bookmarks keeping that fresh, instead of listing everything again each time; the list
  comes back only when the API server says the version is gone (410) or after an error.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable
from functools import partial
from typing import Any, cast

from kubernetes_asyncio import watch
from kubernetes_asyncio.client.exceptions import ApiException

from gpupool.kube.budget_hold import HELD_LABEL
from gpupool.kube.objects import JOB_ID
from gpupool.kube.shapes import KubeObject, ObjectMeta

log = logging.getLogger("gpupool.kube")

# What the hub reads of a kept object (gpupool.kube.status, the controller, the budget hold):
# everything else is dropped as it arrives. At 2,000 Jobs every label, timestamp or condition
# kept that nobody reads costs megabytes (benchmarks.kube counts this process's memory).
META = ("name", "namespace", "uid", "resourceVersion", "deletionTimestamp")
LABELS = (JOB_ID, HELD_LABEL)
JOB_SPEC = ("suspend", "parallelism", "completions", "backoffLimit", "activeDeadlineSeconds")
POD_CONDITIONS = ("DisruptionTarget", "PodScheduled")  # evicted; why it waits for a node


def _meta(obj: dict[str, Any]) -> ObjectMeta:
    meta = obj.get("metadata") or {}
    labels = meta.get("labels") or {}
    kept = {
        **{k: meta[k] for k in META if k in meta},
        "labels": {k: labels[k] for k in LABELS if k in labels},
    }
    return cast(ObjectMeta, kept)  # the keys of ObjectMeta named in META, as the server sent them


def _conditions(status: dict[str, Any], types: tuple[str, ...] | None = None) -> list[dict[str, Any]]:
    return [
        {k: c[k] for k in ("type", "status", "reason", "message") if k in c}
        for c in status.get("conditions") or []
        if types is None or c.get("type") in types
    ]


def trim_job(obj: dict[str, Any]) -> KubeObject:
    """What the hub reads of a Job: its job id and hold labels, its spec's shape, its conditions.
    `obj` is the server's JSON, of any shape; what is kept is a KubeObject's."""
    spec, status = obj.get("spec") or {}, obj.get("status") or {}
    kept = {
        "metadata": _meta(obj),
        "spec": {k: spec[k] for k in JOB_SPEC if k in spec},
        "status": {
            "conditions": _conditions(status),
            **{k: status[k] for k in ("active", "succeeded", "failed") if k in status},
        },
    }
    return cast(KubeObject, kept)


def trim_pod(obj: dict[str, Any]) -> KubeObject:
    """What gpupool.kube.status reads of a pod: phase, the conditions it looks for, whether each
    container runs or ended and with which exit code."""
    status = obj.get("status") or {}
    containers = [
        {
            "state": {
                k: ({"exitCode": v.get("exitCode")} if k == "terminated" else {})
                for k, v in (c.get("state") or {}).items()
            },
        }
        for c in status.get("containerStatuses") or []
    ]
    kept = {
        "metadata": _meta(obj),
        "status": {
            "phase": status.get("phase"),
            "conditions": _conditions(status, POD_CONDITIONS),
            "containerStatuses": containers,
        },
    }
    return cast(KubeObject, kept)


class Follower:
    """A trimmed copy of the objects of one kind in a namespace, or in all ("", a list method
    for all namespaces), matching `label_selector`, kept up to date: `resources` maps "namespace/name" to the trimmed object."""

    def __init__(
        self,
        list_method: Callable[..., Any],  # a kubernetes_asyncio list call (untyped)
        namespace: str,
        label_selector: str,
        trim: Callable[[dict[str, object]], KubeObject],  # the server's JSON -> what is kept of it
        watch_timeout_s: int = 300,
        page: int = 250,
        kind: str = "objects",
    ) -> None:
        self.list_method, self.namespace, self.label_selector = list_method, namespace, label_selector
        self.trim, self.watch_timeout_s, self.page, self.kind = trim, watch_timeout_s, page, kind
        self.resources: dict[str, KubeObject] = {}
        self.lists = 0  # how often everything was listed (a resumed watch lists nothing)
        self.pages = 0  # list requests, all lists together
        self.watches = 0  # watch requests
        self._rv = ""
        self._task: asyncio.Task[object] | None = None

    async def start(self) -> None:
        """List (raises if the API server cannot be read), then keep watching."""
        await self._list()
        self._task = asyncio.create_task(self._run())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except (asyncio.CancelledError, Exception):  # noqa: BLE001 - shutting down
                pass
            self._task = None

    async def _list(self) -> None:
        items: dict[str, KubeObject] = {}
        cont: str | None = None
        while True:
            kwargs: dict[str, object] = {
                "label_selector": self.label_selector,
                "limit": self.page,
                "_preload_content": False,
                "_request_timeout": 60,
            }
            if cont:
                kwargs["_continue"] = cont
            resp = await self.list_method(*self._where(), **kwargs)
            self.pages += 1
            body = json.loads(await resp.read())
            for obj in body.get("items") or []:
                items[_key(obj)] = self.trim(obj)
            meta = body.get("metadata") or {}
            cont = meta.get("continue")
            if not cont:
                break
        self.resources = items  # one assignment: readers never see a half-read list
        self._rv = meta.get("resourceVersion", "")
        self.lists += 1

    def _where(self) -> tuple[str, ...]:
        """The list method's namespace argument: none for a list at cluster scope ("")."""
        return (self.namespace,) if self.namespace else ()

    async def _run(self) -> None:
        delay = 0.1
        while True:
            try:
                await self._watch()
                delay = 0.1  # the watch timed out as asked: resume from where it was
            except asyncio.CancelledError:
                raise
            except ApiException as err:
                if err.status == 410:  # the version is gone from the API server's window: list again
                    log.info("watching %s: resourceVersion %s expired; listing again", self.kind, self._rv)
                    await self._relist(delay)
                    continue
                log.warning("watching %s failed: %s; listing again in %.1f s", self.kind, err, delay)
                await self._relist(delay)
                delay = min(delay * 2, 30)
            except Exception as err:  # noqa: BLE001 - network: list again after a pause, as kubespawner does
                log.warning("watching %s failed: %s; listing again in %.1f s", self.kind, err, delay)
                await self._relist(delay)
                delay = min(delay * 2, 30)

    async def _relist(self, delay: float) -> None:
        await asyncio.sleep(delay)
        try:
            await self._list()
        except asyncio.CancelledError:
            raise
        except Exception as err:  # noqa: BLE001 - the next round tries again
            log.warning("listing %s failed: %s", self.kind, err)

    async def _watch(self) -> None:
        # a partial, as kubespawner does: the watch then hands back plain dicts (raw_object),
        # not the client's model objects, which cost more to build than the event itself
        method = partial(self.list_method, _preload_content=False)
        w = watch.Watch()
        self.watches += 1
        try:
            async with w.stream(
                method,
                *self._where(),
                label_selector=self.label_selector,
                resource_version=self._rv,
                timeout_seconds=self.watch_timeout_s,
                allow_watch_bookmarks=True,
                _request_timeout=self.watch_timeout_s + 30,
            ) as stream:
                async for event in stream:
                    obj = event["raw_object"]
                    rv = (obj.get("metadata") or {}).get("resourceVersion")
                    if event["type"] == "DELETED":
                        self.resources.pop(_key(obj), None)
                    elif event["type"] != "BOOKMARK":
                        self.resources[_key(obj)] = self.trim(obj)
                    if rv:
                        self._rv = rv
        finally:
            w.stop()
            await w.close()


def _key(obj: KubeObject) -> str:
    meta = obj.get("metadata") or {}
    return f"{meta.get('namespace', '')}/{meta.get('name', '')}"
