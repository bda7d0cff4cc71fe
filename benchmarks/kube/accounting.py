"""Train GPU-hours on Kubernetes: what the hub counted (gpupool.kube.pod_spans, the spans the
usage ledger reads) against the truth the benchmark watched (each pod's running interval).

The truth is kept by the benchmark's own pod watch (`observe`): a pod holds its GPUs from the
first time it is seen Running until it is first seen ending (a terminal phase, KAI's
DisruptionTarget condition, a deletion). The hub's side is only what its relist wrote to the
store, across a restart of the hub (a new Store on the same database) while pods are evicted.
`compare` is pure: the matched GPU-seconds are the overlap of the two intervals per pod, so a
count that is long somewhere cannot make up for one that is short elsewhere.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from sqlalchemy import select

from gpupool.store import PodSpanRow, Store

Life = tuple[int, float, float | None]  # GPU milli, start, end (None: still running), epoch seconds


@dataclass(frozen=True)
class Accounting:
    counted: float  # GPU-seconds of the hub's spans that lie inside the true intervals
    truth: float  # GPU-seconds the pods really held
    over: float  # GPU-seconds the hub counted outside them (or for pods that never ran)
    pods: int  # pods in the truth
    missing: int  # of those, pods the hub has no span for

    @property
    def percent(self) -> float:
        return 100.0 * self.counted / self.truth if self.truth else 100.0


def compare(counted: Mapping[str, Life], truth: Mapping[str, Life], until: float) -> Accounting:
    """The hub's spans (`counted`, by pod UID) against the true lives, both cut at `until`."""

    def cut(life: Life) -> tuple[int, float, float]:
        milli, start, end = life
        stop = until if end is None else min(end, until)
        return milli, start, max(start, stop)

    matched = over = total = 0.0
    missing = 0
    for uid, life in truth.items():
        tm, ts, te = cut(life)
        total += tm * (te - ts)
        if uid not in counted:
            missing += 1
            continue
        cm, cs, ce = cut(counted[uid])
        inside = max(0.0, min(ce, te) - max(cs, ts)) * min(cm, tm)
        matched += inside
        over += cm * (ce - cs) - inside
    for uid, life in counted.items():
        if uid not in truth:
            cm, cs, ce = cut(life)
            over += cm * (ce - cs)
    return Accounting(matched / 1000, total / 1000, over / 1000, len(truth), missing)


def observe(lives: dict[str, list], pod: Mapping, deleted: bool, now: float) -> None:
    """Fold one pod watch event into `lives` (uid -> [milli, start, end, job id]): the truth."""
    meta, status = pod.get("metadata") or {}, pod.get("status") or {}
    uid = meta.get("uid")
    if not isinstance(uid, str):
        return
    life = lives.get(uid)
    if life is None and status.get("phase") == "Running" and not deleted:
        milli = 0
        for c in (pod.get("spec") or {}).get("containers") or []:
            milli += 1000 * int(((c.get("resources") or {}).get("limits") or {}).get("nvidia.com/gpu", 0))
        job = str((meta.get("labels") or {}).get("gpupool.io/job-id", ""))
        lives[uid] = life = [milli, now, None, job]
    if life is None or life[2] is not None:
        return
    ending = (
        deleted
        or status.get("phase") in ("Succeeded", "Failed")
        or bool(meta.get("deletionTimestamp"))
        or any(c.get("type") == "DisruptionTarget" for c in status.get("conditions") or [])
    )
    if ending:
        life[2] = now


def recorded(store: Store, jobs: set[str]) -> tuple[dict[str, Life], int]:
    """The spans the hub recorded for `jobs`, as the usage ledger reads them, and how many of
    them were closed when last seen (their pods vanished between two lists)."""
    with store.session() as s:
        rows = [r for r in s.scalars(select(PodSpanRow)) if r.job in jobs]
    spans = {r.uid: (r.milli, float(r.start), None if r.end is None else float(r.end)) for r in rows}
    return spans, sum(not r.exact for r in rows)


def line(a: Accounting, inexact: int) -> str:
    # The line also asks for the ETA's median error against the fair baseline: this run
    # queues nothing (every Job fits, the stand-in scheduler binds at once); benchmarks.kube.eta
    # measures it on KAI's real scheduler, and `python -m benchmarks.kube` joins both halves.
    return (
        f"kube accounting: train GPU-hours counted {a.counted / 3600:.2f} of {a.truth / 3600:.2f}"
        f" ({a.percent:.2f} %; target >= 99 %: {'met' if a.percent >= 99 else 'NOT met'}),"
        f" {a.over / 3600:.3f} counted beyond the pods' lives, {a.pods} pods ({a.missing} unrecorded,"
        f" {inexact} closed when last seen)"
    )
