"""Train jobs' GPU-hours on Kubernetes from the cluster's own record: pods' lifetimes.

A train Job placed by KAI holds no hub allocation, so its GPU-hours are read from its pods:
a pod holds its GPUs (or its fraction) from the time the kubelet started it (`startTime`)
until its last container ended (`finishedAt`), or, for a pod deleted before its containers
reported an end, until its `deletionTimestamp` plus the grace period it was given.

This module is the pure half (no I/O): `span_of` reads one pod, `fold` merges what the
watch or a relist delivers into what the hub has recorded, keyed by the pod's UID. It is
idempotent, so a restart's relist or a watch event delivered twice never counts a pod twice,
and a recorded end is never moved. A pod the hub has a start for but that a full list no
longer holds (it was preempted and deleted while the hub was down, and nothing kept it) is
closed at the last time the hub knew it was alive, marked `exact=False`, so the loss is said
rather than hidden; the I/O half keeps that case rare with a finalizer on train pods
(`FINALIZER`), released only once `fold` has an end for the pod (`releasable`).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from gpupool.gpu.sharing import SharingBackend, UnreadableGPU, read_pod
from gpupool.kube.usage_finalizer import FINALIZER

TERMINAL = ("Succeeded", "Failed")
MAX_TIME_CHARS = 40  # an RFC 3339 time is ~20; anything longer is not one


@dataclass(frozen=True)
class PodSpan:
    uid: str
    job: str  # gpupool job id (the pod's gpupool.io/job-id label)
    owner: str
    milli: int  # GPU milli the pod held (1000 = one whole GPU)
    start: int  # epoch seconds
    end: int | None  # None: still running
    node: str = ""
    exact: bool = True  # False: closed at the last time seen alive (the pod vanished unseen)
    seen: int = 0  # last time the hub saw it alive (epoch seconds)

    def gpu_milli_seconds(self, now: int) -> int:
        return self.milli * max(0, (now if self.end is None else self.end) - self.start)


def parse_time(value: object) -> int | None:
    """An RFC 3339 time from the API server as epoch seconds (None: absent or unreadable)."""
    if not isinstance(value, str) or not value or len(value) > MAX_TIME_CHARS:
        return None
    try:
        t = dt.datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
    if t.tzinfo is None:
        t = t.replace(tzinfo=dt.UTC)
    return int(t.timestamp())


def _end_of(pod: Mapping[str, Any], now: int | None = None) -> int | None:
    """When the pod let go of its GPUs, if it did (by `now`: a pod still said to run past its
    deletionTimestamp, the end of its grace period, was killed then; its node never said so)."""
    status = pod.get("status") or {}
    ends: list[int] = []
    running = False
    for c in status.get("containerStatuses") or []:
        state = c.get("state") or {}
        if "terminated" in state:
            t = parse_time((state["terminated"] or {}).get("finishedAt"))
            if t is not None:
                ends.append(t)
        else:
            running = True
    if ends and (status.get("phase") in TERMINAL or not running):
        return max(ends)
    meta = pod.get("metadata") or {}
    deleted = parse_time(meta.get("deletionTimestamp"))
    if deleted is not None and status.get("phase") in TERMINAL:
        return deleted  # terminal without container ends (evicted before it ran them)
    if deleted is not None and now is not None and now >= deleted:
        return deleted  # the kubelet kills what is left at the end of the grace period
    return None


MemoryOf = Callable[[str], int]  # a node's name -> the memory of one of its GPUs (MiB; 0: unknown)


def span_of(
    pod: Mapping[str, Any],
    readers: Sequence[SharingBackend],
    memory_mib: int = 0,
    memory_of: MemoryOf | None = None,
    now: int | None = None,
) -> PodSpan | None:
    """The GPU interval a pod holds or held; None for a pod that never started or holds no GPU.
    A share asked as GPU memory (KAI's `gpu-memory`) is read against the card of the node it ran
    on (`memory_of`), else `memory_mib`; with neither, as a whole GPU. With `now`, a pod deleted
    whose grace period is over has ended, whatever its node last said (a lost node's pod)."""
    meta = pod.get("metadata") or {}
    uid = meta.get("uid")
    start = parse_time((pod.get("status") or {}).get("startTime"))
    if not isinstance(uid, str) or not uid or start is None:
        return None
    node = str((pod.get("spec") or {}).get("nodeName") or "")
    if memory_of is not None and node:
        memory_mib = memory_of(node) or memory_mib
    try:
        milli = read_pod(dict(pod), readers, memory_mib)
    except (UnreadableGPU, ValueError, ArithmeticError):
        return None
    if milli <= 0:
        return None
    labels = meta.get("labels") or {}
    annotations = meta.get("annotations") or {}
    end = _end_of(pod, now)
    return PodSpan(
        uid=uid,
        job=str(labels.get("gpupool.io/job-id", "")),
        owner=str(annotations.get("gpupool.io/owner") or labels.get("gpupool.io/owner", "")),
        milli=milli,
        start=start,
        end=None if end is None else max(start, end),
        node=node,
    )


def fold(
    known: Mapping[str, PodSpan],
    pods: Iterable[Mapping[str, Any]],
    now: int,
    readers: Sequence[SharingBackend],
    memory_mib: int = 0,
    full_list: bool = False,
    memory_of: MemoryOf | None = None,
) -> dict[str, PodSpan]:
    """The spans to write: new pods, ends newly seen, and (after a `full_list`) open spans
    whose pods are gone. Spans already recorded with an end are never changed; a start is
    never moved (the first record of a pod is its start)."""
    return fold_spans(known, spans_of(pods, readers, memory_mib, memory_of), now, full_list)


def spans_of(
    pods: Iterable[Mapping[str, Any]],
    readers: Sequence[SharingBackend],
    memory_mib: int = 0,
    memory_of: MemoryOf | None = None,
    now: int | None = None,
) -> Iterator[tuple[str, PodSpan | None]]:
    """(uid, its span or None) of each listed pod with a UID: all `fold_spans` needs of a pod."""
    for pod in pods:
        uid = (pod.get("metadata") or {}).get("uid")
        if isinstance(uid, str):
            yield uid, span_of(pod, readers, memory_mib, memory_of, now)


def fold_spans(
    known: Mapping[str, PodSpan],
    listed: Iterable[tuple[str, PodSpan | None]],
    now: int,
    full_list: bool = False,
) -> dict[str, PodSpan]:
    """`fold` on what was kept of each listed pod (`spans_of`), so that a relist can read the
    pods a page at a time and hold only their spans, never the pods themselves."""
    changed: dict[str, PodSpan] = {}
    seen: set[str] = set()
    for uid, span in listed:
        seen.add(uid)
        if span is None:
            continue
        old = changed.get(span.uid) or known.get(span.uid)
        if old is None:
            changed[span.uid] = replace(span, seen=now if span.end is None else span.end)
        elif old.end is None and span.end is not None:
            changed[span.uid] = replace(old, end=max(old.start, span.end), exact=True)
        elif old.end is None:
            changed[span.uid] = replace(old, seen=max(old.seen, now))
    if full_list:
        for uid, old in known.items():
            if old.end is None and uid not in seen and uid not in changed:
                changed[uid] = replace(old, end=max(old.start, old.seen), exact=False)
    return changed


def releasable(
    pod: Mapping[str, Any],
    known: Mapping[str, PodSpan],
    readers: Sequence[SharingBackend],
    memory_mib: int = 0,
) -> bool:
    """Whether the hub may drop its finalizer from `pod`: its end is recorded, or it is being
    deleted and holds no GPU interval the hub counts (it never started, or asked for no GPU)."""
    meta = pod.get("metadata") or {}
    if FINALIZER not in (meta.get("finalizers") or []):
        return False
    deleting = bool(meta.get("deletionTimestamp"))
    return release(str(meta.get("uid", "")), span_of(pod, readers, memory_mib), deleting, known)


def release(uid: str, span: PodSpan | None, deleting: bool, known: Mapping[str, PodSpan]) -> bool:
    """`releasable` on what a relist keeps of a pod holding the finalizer: its span as listed,
    whether it is being deleted, and the spans recorded (`known`, after the fold was saved)."""
    recorded = known.get(uid)
    if recorded is not None:
        return recorded.end is not None
    return deleting and span is None
