"""kubespawner's pod and event reflectors, keeping each object without its managedFields.

kubespawner keeps every workspace pod (and every pod event of the namespace) as the API server
sends it, for the hub's whole life. A pod's `metadata.managedFields` (which field manager set
which field, for server-side apply) is about a third of it and nothing in kubespawner, JupyterHub
or gpupool reads it: benchmarks.kube measured kubespawner's reflector at 41 KB a pod, 20 MiB for
500 workspaces, the largest part of what the hub holds for them, and the objects it is made of
are walked by every full garbage collection of the hub. Everything else of the object is kept
as sent, so kubespawner, an admin's hooks and gpupool read what they read before.
"""

from __future__ import annotations

import asyncio
from typing import Any

from kubespawner.spawner import EventReflector, PodReflector
from traitlets import HasTraits, observe, validate

DROPPED = "managedFields"


def trimmed(obj: object) -> object:
    """`obj` (a pod or event as parsed from the API server) without its managedFields, in place:
    the reflector is the only holder of the parsed object."""
    meta = obj.get("metadata") if isinstance(obj, dict) else None
    if isinstance(meta, dict):
        meta.pop(DROPPED, None)
    return obj


class TrimmedStore(dict[str, object]):
    """The reflector's `resources`: each object trimmed as it is stored. kubespawner's watch loop
    stores objects one by one (`resources[key] = obj`, `resources.pop(key, None)`) and its list
    replaces the whole dict. `changed(key)` is a future resolved at the next store or removal of
    that key: a starting workspace waits on it (gpupool.spawner.kube_ready) instead of looking at
    its pod every few milliseconds."""

    def __init__(self) -> None:
        super().__init__()
        self.waiters: dict[str, list[asyncio.Future[None]]] = {}

    def __setitem__(self, key: str, obj: object) -> None:
        super().__setitem__(key, trimmed(obj))
        self.wake(key)

    def pop(self, key: str, *default: object) -> Any:
        try:
            return super().pop(key, *default)
        finally:
            self.wake(key)

    def changed(self, key: str) -> asyncio.Future[None]:
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.waiters.setdefault(key, []).append(fut)
        return fut

    def wake(self, key: str | None = None) -> None:
        """Resolve the futures waiting on `key` (every key: None)."""
        keys = list(self.waiters) if key is None else [key]
        for k in keys:
            for fut in self.waiters.pop(k, ()):
                if not fut.done():
                    fut.set_result(None)


class TrimmedReflector(HasTraits):
    """Mix in before a kubespawner ResourceReflector."""

    @validate("resources")
    def _trimmed_store(self, proposal: dict[str, Any]) -> TrimmedStore:
        value = proposal["value"]
        if isinstance(value, TrimmedStore):
            return value
        store = TrimmedStore()
        for key, obj in value.items():
            store[key] = obj
        return store

    @observe("resources")
    def _wake_replaced_store(self, change: dict[str, object]) -> None:
        """A list replaced the store: whoever waited on the old one looks again."""
        old = change["old"]
        if isinstance(old, TrimmedStore):
            old.wake()


class TrimmedPodReflector(TrimmedReflector, PodReflector):
    pass


class TrimmedEventReflector(TrimmedReflector, EventReflector):
    pass


TRIMMED = {PodReflector: TrimmedPodReflector, EventReflector: TrimmedEventReflector}
