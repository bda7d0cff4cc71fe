"""Train jobs' GPU-hours on Kubernetes from pods' lifetimes (gpupool.kube.pod_usage): exact across
hub restarts, a preemption while the hub is down, and events delivered twice."""

from __future__ import annotations

import datetime as dt

from gpupool.gpu.sharing import KAISharing, WholeGPUs
from gpupool.kube.pod_usage import FINALIZER, PodSpan, fold, parse_time, releasable, span_of

READERS = (KAISharing(), WholeGPUs())
T0 = 1_790_000_000  # epoch seconds


def iso(t: int) -> str:
    return dt.datetime.fromtimestamp(t, dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def pod(
    uid: str,
    start: int | None = T0,
    end: int | None = None,
    gpus: int = 1,
    fraction: str = "",
    phase: str | None = None,
    deleted: int | None = None,
    finalizer: bool = True,
) -> dict:
    limits = {"nvidia.com/gpu": str(gpus)} if gpus and not fraction else {}
    annotations = {"gpupool.io/owner": "ana"} | ({"gpu-fraction": fraction} if fraction else {})
    state = {"terminated": {"exitCode": 0, "finishedAt": iso(end)}} if end is not None else {"running": {}}
    status: dict = {"phase": phase or ("Succeeded" if end is not None else "Running" if start else "Pending")}
    if start is not None:
        status["startTime"] = iso(start)
        status["containerStatuses"] = [{"name": "train", "state": state}]
    meta: dict = {
        "uid": uid,
        "name": f"job-{uid}",
        "labels": {"gpupool.io/job-id": "j1"},
        "annotations": annotations,
        "finalizers": [FINALIZER] if finalizer else [],
    }
    if deleted is not None:
        meta["deletionTimestamp"] = iso(deleted)
    return {
        "metadata": meta,
        "spec": {"nodeName": "n1", "containers": [{"name": "train", "resources": {"limits": limits}}]},
        "status": status,
    }


class Book:
    """What the hub's store would hold: fold's changes written by UID (the I/O half's upsert)."""

    def __init__(self) -> None:
        self.spans: dict[str, PodSpan] = {}

    def feed(self, pods: list[dict], now: int, full_list: bool = False) -> dict[str, PodSpan]:
        changed = fold(self.spans, pods, now, READERS, full_list=full_list)
        self.spans.update(changed)
        return changed

    def gpu_seconds(self, now: int) -> float:
        return sum(s.gpu_milli_seconds(now) for s in self.spans.values()) / 1000


def test_a_finished_pod_counts_its_gpus_times_its_run_time():
    book = Book()
    book.feed([pod("a", T0, T0 + 3600, gpus=2)], now=T0 + 4000)
    assert book.gpu_seconds(T0 + 9999) == 2 * 3600
    (span,) = book.spans.values()
    assert (span.job, span.owner, span.node, span.exact) == ("j1", "ana", "n1", True)


def test_a_fraction_counts_its_share():
    book = Book()
    book.feed([pod("a", T0, T0 + 1000, fraction="0.25")], now=T0 + 2000)
    assert book.gpu_seconds(T0 + 2000) == 250


def test_a_pending_pod_and_a_cpu_pod_count_nothing():
    book = Book()
    assert book.feed([pod("p", start=None), pod("c", gpus=0)], now=T0 + 10) == {}


def test_a_running_pod_counts_until_now_then_until_its_end():
    book = Book()
    book.feed([pod("a", T0)], now=T0 + 60)
    assert book.gpu_seconds(T0 + 600) == 600
    book.feed([pod("a", T0, T0 + 900)], now=T0 + 1000)
    assert book.gpu_seconds(T0 + 99999) == 900


def test_double_delivery_and_a_restarts_relist_never_count_twice():
    book = Book()
    finished = pod("a", T0, T0 + 3600)
    book.feed([finished], now=T0 + 3700)
    assert book.feed([finished], now=T0 + 3701) == {}  # the same event again
    # a restart: the store is read back and the cluster listed again
    restarted = Book()
    restarted.spans = dict(book.spans)
    assert restarted.feed([finished], now=T0 + 7200, full_list=True) == {}
    assert restarted.gpu_seconds(T0 + 99999) == 3600


def test_an_end_is_never_moved_nor_a_start():
    book = Book()
    book.feed([pod("a", T0, T0 + 100)], now=T0 + 200)
    # a later object with other times (a stale or hostile copy) changes nothing
    assert book.feed([pod("a", T0 + 50, T0 + 5000)], now=T0 + 6000) == {}
    assert book.gpu_seconds(T0 + 6000) == 100


def test_a_pod_that_started_and_ended_while_the_hub_was_down_counts_exactly():
    book = Book()
    book.feed([], now=T0, full_list=True)  # the hub goes down before the pod starts
    book.feed([pod("a", T0 + 10, T0 + 1810)], now=T0 + 5000, full_list=True)
    assert book.gpu_seconds(T0 + 5000) == 1800


def test_a_preemption_while_the_hub_is_down_is_read_from_the_pod_the_finalizer_kept():
    book = Book()
    book.feed([pod("a", T0)], now=T0 + 60)  # seen running, then the hub goes down
    # KAI preempts it at T0+1000: the pod is deleted, its container ends, our finalizer keeps it
    preempted = pod("a", T0, T0 + 1030, phase="Failed", deleted=T0 + 1000)
    # a replacement pod starts at T0+2000 on another node
    replacement = pod("b", T0 + 2000)
    book.feed([preempted, replacement], now=T0 + 4000, full_list=True)
    assert book.spans["a"].end == T0 + 1030 and book.spans["a"].exact
    assert book.gpu_seconds(T0 + 4000) == 1030 + 2000
    assert releasable(preempted, book.spans, READERS)
    assert not releasable(replacement, book.spans, READERS)


def test_a_pod_gone_unseen_is_closed_where_last_seen_and_marked_inexact():
    book = Book()
    book.feed([pod("a", T0)], now=T0 + 60)
    book.feed([pod("a", T0)], now=T0 + 600)  # last seen alive
    book.feed([], now=T0 + 9000, full_list=True)  # force-deleted while the hub was down
    span = book.spans["a"]
    assert (span.end, span.exact) == (T0 + 600, False)
    # a watch event (not a full list) without the pod closes nothing
    book2 = Book()
    book2.feed([pod("x", T0)], now=T0 + 60)
    assert book2.feed([pod("y", T0)], now=T0 + 70).keys() == {"y"}
    assert book2.spans["x"].end is None


def test_a_pod_deleted_before_it_started_releases_its_finalizer_and_counts_nothing():
    book = Book()
    never = pod("p", start=None, deleted=T0 + 5)
    assert book.feed([never], now=T0 + 6) == {}
    assert releasable(never, book.spans, READERS)
    assert not releasable(pod("q", start=None), book.spans, READERS)  # still waiting, not deleted
    assert not releasable(pod("r", T0, T0 + 1, finalizer=False), book.spans, READERS)


def test_hostile_times_are_not_read():
    assert parse_time("x" * 10_000) is None
    assert parse_time("not a time") is None
    assert parse_time(12) is None
    assert parse_time("2026-11-28T10:00:00Z") == 1_795_860_000
    bad = pod("a", T0)
    bad["status"]["startTime"] = "garbage"
    assert span_of(bad, READERS) is None
