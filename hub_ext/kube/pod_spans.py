"""Train pods' GPU intervals on Kubernetes, recorded: the I/O half of gpupool.kube.pod_usage.

A periodic relist (not a watch: a train pod lives minutes to days, and one list a minute of
the train namespace's gpupool pods is cheap) reads every pod with the gpupool.io/job-id label a
page at a time, keeps each pod's span only, folds them into what the store holds (`fold_spans`
with `full_list=True`) and writes what changed to gpupool_pod_spans, where the usage ledger reads
them as train jobs' GPU-hours.

What it cannot see exactly: a pod that ended and was deleted between two lists (its Job's TTL,
a preemption that deletes it) is closed at the last list that saw it alive, `exact=False`; the
count is then short by at most one relist interval per such pod.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import AsyncIterator, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import select

from gpupool.gpu.sharing import SharingBackend, WholeGPUs
from gpupool.kube.pod_usage import FINALIZER, MemoryOf, PodSpan, fold_spans, release, span_of, spans_of
from gpupool.store import PodSpanRow, Store

log = logging.getLogger(__name__)

JOB_LABEL = "gpupool.io/job-id"
PAGE = 250  # pods per list request: a relist never holds a huge response at once
MAX_PAGES = 400  # 100,000 pods: a namespace beyond that is not listed further this pass


def readers_for(backend: SharingBackend | None) -> tuple[SharingBackend, ...]:
    """What reads a train pod's GPUs: the configured sharing, then whole device-plugin GPUs."""
    if backend is None or isinstance(backend, WholeGPUs):
        return (WholeGPUs(),)
    return (backend, WholeGPUs())


def load(store: Store, uids: Iterable[str]) -> dict[str, PodSpan]:
    """The recorded spans `fold` needs: every open one, and those of the pods just listed
    (so a pod whose end is recorded is never recorded again)."""
    listed = list(set(uids))
    with store.session() as s:
        rows = list(s.scalars(select(PodSpanRow).where(PodSpanRow.end.is_(None))))
        for i in range(0, len(listed), 500):  # bounded IN lists
            rows += s.scalars(select(PodSpanRow).where(PodSpanRow.uid.in_(listed[i : i + 500])))
    return {r.uid: _span(r) for r in rows}


def save(store: Store, changed: Mapping[str, PodSpan]) -> None:
    if not changed:
        return
    with store.session() as s:
        for span in changed.values():
            s.merge(
                PodSpanRow(
                    uid=span.uid,
                    job=span.job[:64],
                    owner=span.owner[:255],
                    milli=span.milli,
                    start=span.start,
                    end=span.end,
                    node=span.node[:255],
                    exact=span.exact,
                    seen=span.seen,
                )
            )


def _span(r: PodSpanRow) -> PodSpan:
    return PodSpan(r.uid, r.job, r.owner, r.milli, r.start, r.end, r.node, r.exact, r.seen)


async def pages(core: Any, namespace: str) -> AsyncIterator[list[dict[str, Any]]]:
    """The pods of gpupool train jobs in `namespace` (in all namespaces when "": jobs in their
    owners' namespaces) as the API server sends them, one page (`PAGE` pods) at a time: the
    caller keeps what it needs of a page before the next is read, never the whole list."""
    cont = ""
    for _ in range(MAX_PAGES):
        kwargs: dict[str, Any] = {
            "label_selector": JOB_LABEL,
            "limit": PAGE,
            "_preload_content": False,  # plain dicts: the client's models cost more than the pod
            "_request_timeout": 60,
        }
        if cont:
            kwargs["_continue"] = cont
        if namespace:
            resp = await core.list_namespaced_pod(namespace, **kwargs)
        else:
            resp = await core.list_pod_for_all_namespaces(**kwargs)
        body = json.loads(await resp.read())
        cont = (body.get("metadata") or {}).get("continue") or ""
        yield [p for p in body.get("items") or [] if isinstance(p, dict)]
        del body  # the page's pods go before the next page is read
        if not cont:
            return
    raise RuntimeError(
        f"more than {MAX_PAGES * PAGE} train pods in {namespace or 'all namespaces'}: not a full list"
    )


@dataclass(frozen=True, slots=True)
class Holder:
    """What a relist keeps of a train pod that holds the usage finalizer: enough to release it."""

    uid: str
    namespace: str
    name: str
    index: int  # the finalizer's place in metadata.finalizers (the patch tests it is still there)
    deleting: bool
    span: PodSpan | None


def holder(pod: Mapping[str, Any], span: PodSpan | None) -> Holder | None:
    meta = pod.get("metadata") or {}
    finalizers = meta.get("finalizers") or []
    if not isinstance(finalizers, list) or FINALIZER not in finalizers:
        return None
    return Holder(
        str(meta.get("uid", "")),
        str(meta.get("namespace", "")),
        str(meta.get("name", "")),
        finalizers.index(FINALIZER),
        bool(meta.get("deletionTimestamp")),
        span,
    )


async def relist(
    store: Store,
    core: object,
    namespace: str,
    readers: Sequence[SharingBackend],
    now: int | None = None,
    memory_of: MemoryOf | None = None,
    memory_mib: int = 0,
) -> dict[str, PodSpan]:
    """One pass of the hub's usage relist: every train pod, read a page at a time and kept as
    its span only (a parsed pod is many times its span, and 2,000 of them held at once set the
    hub's memory high-water mark), folded into the store as one full list; then the usage
    finalizer is taken off the pods whose end is now recorded (`release`). Returns the spans
    it wrote."""
    now = int(time.time()) if now is None else now
    listed: list[tuple[str, PodSpan | None]] = []
    holders: list[Holder] = []
    async for page in pages(core, namespace):
        for pod in page:
            uid = (pod.get("metadata") or {}).get("uid")
            if not isinstance(uid, str):
                continue
            span = span_of(pod, readers, memory_mib, memory_of, now)
            listed.append((uid, span))
            if (h := holder(pod, span)) is not None:
                holders.append(h)
    known = load(store, [uid for uid, _ in listed])
    changed = fold_spans(known, listed, now, full_list=True)
    save(store, changed)  # recorded first: a finalizer goes only once the end is in the store
    known.update(changed)
    for h in holders:
        if release(h.uid, h.span, h.deleting, known):
            await release_finalizer(core, h)
    return changed


async def release_finalizer(core: Any, h: Holder) -> bool:
    """Takes the usage finalizer off one pod (a JSON patch that first tests it is still where
    it was listed, so another controller's finalizers are never touched). False when the pod
    changed or went meanwhile: the next relist sees it again."""
    path = f"/metadata/finalizers/{h.index}"
    patch = [{"op": "test", "path": path, "value": FINALIZER}, {"op": "remove", "path": path}]
    try:
        await core.patch_namespaced_pod(h.name, h.namespace, patch, _request_timeout=30)
    except Exception as err:  # noqa: BLE001 - network or a conflict: the next relist retries
        log.info("usage finalizer of pod %s/%s kept for now: %s", h.namespace, h.name, err)
        return False
    return True


def record(
    store: Store,
    pods: Sequence[Mapping[str, object]],
    readers: Sequence[SharingBackend],
    now: int | None = None,
    memory_of: MemoryOf | None = None,
    memory_mib: int = 0,
) -> dict[str, PodSpan]:
    """Fold one full list of train pods, held whole, into the store; returns the spans it wrote.
    A share asked as GPU memory is read against its node's card (`memory_of`), else `memory_mib`."""
    listed = list(spans_of(pods, readers, memory_mib, memory_of))
    now = int(time.time()) if now is None else now
    changed = fold_spans(load(store, [uid for uid, _ in listed]), listed, now, full_list=True)
    save(store, changed)
    return changed
