"""Train jobs' GPU-hours on Kubernetes in the usage report: train pods' lifetimes folded into a real
store (gpupool.kube.pod_spans) and read by the usage ledger as train sessions, the same after a
hub restart, and never counted twice when the same pods are listed again."""

from __future__ import annotations

import datetime as dt
import json

import pytest

from gpupool.gpu.sharing import KAISharing
from gpupool.kube import pod_spans
from gpupool.store import TrainJob
from gpupool.usage.config import Usage
from gpupool.usage.service import UsageService
from tests.support.pools import make_pool

H = 3600
NOW = 1_790_000_000  # epoch seconds: the report's clock, injected
READERS = pod_spans.readers_for(KAISharing())


def iso(t: int) -> str:
    return dt.datetime.fromtimestamp(t, dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def pod(uid: str, job: str, start: int, end: int | None = None, gpus: int = 0, fraction: str = "") -> dict:
    """A train pod as the API server lists it: `gpus` whole GPUs or a KAI `fraction` of one."""
    state = {"terminated": {"exitCode": 0, "finishedAt": iso(end)}} if end is not None else {"running": {}}
    return {
        "metadata": {
            "uid": uid,
            "name": f"{job}-{uid}",
            "labels": {"gpupool.io/job-id": job},
            "annotations": {"gpupool.io/owner": "cy"} | ({"gpu-fraction": fraction} if fraction else {}),
        },
        "spec": {
            "nodeName": "n1",
            "containers": [
                {"name": "train", "resources": {"limits": {"nvidia.com/gpu": str(gpus)} if gpus else {}}}
            ],
        },
        "status": {
            "phase": "Succeeded" if end is not None else "Running",
            "startTime": iso(start),
            "containerStatuses": [{"name": "train", "state": state}],
        },
    }


def train_hours(usage: UsageService, by: str = "project") -> dict[str, float]:
    report = usage.report(NOW - 6 * H, NOW + 1, by)
    return {r["key"]: r["allocated_gpu_hours"] for r in report["rows"]}


def test_train_pods_on_kubernetes_count_in_the_usage_report_exactly_once_across_a_restart(tmp_path) -> None:
    pool = make_pool(tmp_path, 2, db="kube-usage.sqlite")
    with pool.store.session() as s:
        s.add(
            TrainJob(
                id="j1",
                owner="cy",
                project="vision",
                name="x",
                num_gpu=2,
                gpu_milli=1000,
                command=["true"],
                workdir="/nonexistent",
                submitted=0.0,
            )
        )
    usage = UsageService(pool, Usage(), clock=lambda: NOW)
    assert train_hours(usage) == {}  # nothing recorded: on Kubernetes no allocation counts a job
    # j1 was preempted after its first pod ran an hour on 2 GPUs; its second pod runs since then.
    # A job the store has no row of (another hub's) counts under project "?"; a half GPU for 2 h.
    first = [
        pod("u1", "j1", NOW - 4 * H, NOW - 3 * H, gpus=2),
        pod("u2", "j1", NOW - 3 * H, gpus=2),
        pod("u3", "j9", NOW - 2 * H, fraction="0.5"),
    ]
    assert len(pod_spans.record(pool.store, first, READERS, NOW - H)) == 3
    hours = train_hours(usage)
    assert hours["vision"] == pytest.approx(2 * 1 + 2 * 3)  # the running pod counts up to now
    assert hours["?"] == pytest.approx(0.5 * 2)
    assert train_hours(usage, "kind") == {"train": pytest.approx(9.0)}
    # the same list again (a second pass, or a hub restart's first) moves no start and no end:
    # only the running pods' last-seen time is written
    again = pod_spans.record(pool.store, first, READERS, NOW - H)
    assert {u: (s.start, s.end) for u, s in again.items()} == {
        "u2": (NOW - 3 * H, None),
        "u3": (NOW - 2 * H, None),
    }
    assert train_hours(usage)["vision"] == pytest.approx(8.0)
    # the running pod is gone from the next full list (deleted while the hub was not looking):
    # closed when last seen alive, an hour ago, and said to be inexact
    closed = pod_spans.record(pool.store, first[:1] + first[2:], READERS, NOW)
    assert {u: (s.end, s.exact) for u, s in closed.items()} == {"u2": (NOW - H, False), "u3": (None, True)}
    # a restarted hub: a new store object on the same file reads the same GPU-hours
    restarted = make_pool(tmp_path, pool.inventory, db="kube-usage.sqlite")
    hours = train_hours(UsageService(restarted, Usage(), clock=lambda: NOW))
    assert hours == {"vision": pytest.approx(2 + 2 * 2), "?": pytest.approx(1.0)}
    # a user sees their own train jobs' GPU-hours, and the CSV carries them
    mine = usage.report(NOW - 6 * H, NOW + 1, "user", owner="cy")
    assert mine["total"]["allocated_gpu_hours"] == pytest.approx(7.0)
    assert "cy,7.0" in usage.csv(mine)


def test_a_share_asked_as_gpu_memory_counts_as_its_part_of_the_nodes_card(tmp_path) -> None:
    """KAI's `gpu-memory` (a share asked in MiB): 20 GiB of an 80 GiB card is a quarter GPU; it
    was read with no card size and counted as a whole GPU, four times its GPU-hours."""
    pool = make_pool(tmp_path, 1, db="kube-memory.sqlite")
    usage = UsageService(pool, Usage(), clock=lambda: NOW)
    big = pod("m1", "j8", NOW - 2 * H, NOW)
    big["metadata"]["annotations"]["gpu-memory"] = "20480"
    small = pod("m2", "j8", NOW - 2 * H, NOW)
    small["metadata"]["annotations"]["gpu-memory"] = "20480"
    small["spec"]["nodeName"] = "t4-node"
    cards = {"n1": 81920, "t4-node": 16384}.get
    spans = pod_spans.record(pool.store, [big, small], READERS, NOW, memory_of=lambda n: cards(n, 0))
    assert {u: s.milli for u, s in spans.items()} == {"m1": 250, "m2": 1000}  # all of a 16 GiB card
    assert train_hours(usage) == {"?": pytest.approx(0.25 * 2 + 1 * 2)}


async def test_the_relist_reads_every_page_of_train_pods_and_closes_those_gone(tmp_path) -> None:
    """The API server answers a list in pages (limit/continue): every page is folded, and the
    pages together are one full list (a recorded pod on none of them is closed)."""

    class Resp:
        def __init__(self, body: dict) -> None:
            self.body = body

        async def read(self) -> bytes:
            return json.dumps(self.body).encode()

    class Pages:
        def __init__(self) -> None:
            self.calls: list[dict] = []

        async def list_namespaced_pod(self, namespace: str, **kw: object) -> Resp:
            self.calls.append({"namespace": namespace, **kw})
            if kw.get("_continue") == "p2":
                return Resp({"items": [pod("u2", "j1", NOW - H, gpus=1)], "metadata": {}})
            return Resp({"items": [pod("u1", "j1", NOW - H, gpus=1)], "metadata": {"continue": "p2"}})

    pool = make_pool(tmp_path, 1, db="kube-pages.sqlite")
    pod_spans.record(pool.store, [pod("u0", "j0", NOW - 2 * H, gpus=1)], READERS, NOW - H)
    core = Pages()
    spans = await pod_spans.relist(pool.store, core, "train", READERS, NOW)
    assert {u: (s.start, s.end, s.exact) for u, s in spans.items()} == {
        "u0": (NOW - 2 * H, NOW - H, False),  # on no page: gone, closed when last seen
        "u1": (NOW - H, None, True),
        "u2": (NOW - H, None, True),  # on the second page only
    }
    assert {c["label_selector"] for c in core.calls} == {"gpupool.io/job-id"}
    assert {c["namespace"] for c in core.calls} == {"train"}
    assert [c.get("_continue") for c in core.calls] == [None, "p2"]


class Cluster:
    """The API server's side of a relist: one page of pods, and the patches the hub sends."""

    def __init__(self, pods: list[dict], refuse: bool = False) -> None:
        self.pods, self.refuse = pods, refuse
        self.patches: dict[str, list] = {}

    async def list_namespaced_pod(self, namespace: str, **kw: object):
        body = json.dumps({"items": self.pods, "metadata": {}}).encode()

        class Resp:
            async def read(self) -> bytes:
                return body

        return Resp()

    async def patch_namespaced_pod(self, name: str, namespace: str, body: list, **kw: object) -> None:
        if self.refuse:
            raise RuntimeError("422: the test operation failed")
        self.patches[name] = body


def held(p: dict, *finalizers: str, deleted: int | None = None) -> dict:
    p["metadata"] |= {"namespace": "train", "finalizers": list(finalizers)}
    if deleted is not None:
        p["metadata"]["deletionTimestamp"] = iso(deleted)
    return p


async def test_the_usage_finalizer_comes_off_a_train_pod_once_its_end_is_recorded(tmp_path) -> None:
    """A pod deleted while the hub was down is kept by the finalizer, its end still on it: the next
    relist records that end exactly, then takes the finalizer off (only its own, tested in place).
    A pod still running keeps it; so does every pod when the patch is refused (the next relist
    retries); a pod whose node was lost goes at the end of its grace period, never stuck."""
    usage = "gpupool.io/usage"
    pool = make_pool(tmp_path, 1, db="kube-finalizer.sqlite")
    ended = held(pod("u1", "j1", NOW - 2 * H, NOW - H, gpus=1), "batch.kubernetes.io/job-tracking", usage)
    running = held(pod("u2", "j1", NOW - H, gpus=1), usage)
    lost = held(pod("u3", "j2", NOW - H, gpus=1), usage, deleted=NOW - 60)  # no kubelet said it ended
    never = held(pod("u4", "j3", NOW), usage, deleted=NOW - 5)
    del never["status"]["startTime"]  # deleted before it started: no GPU-hours
    # the hub saw u1 running before it went down; u1 was preempted and deleted meanwhile
    pod_spans.record(pool.store, [pod("u1", "j1", NOW - 2 * H, gpus=1)], READERS, NOW - 2 * H + 60)
    refused = Cluster([ended, running, lost, never], refuse=True)
    spans = await pod_spans.relist(pool.store, refused, "train", READERS, NOW)
    assert refused.patches == {}  # refused: nothing raised, the ends are recorded all the same
    cluster = Cluster([ended, running, lost, never])
    await pod_spans.relist(pool.store, cluster, "train", READERS, NOW)
    assert {u: (s.end, s.exact) for u, s in spans.items()} == {
        "u1": (NOW - H, True),  # its real end, not "closed when last seen"
        "u2": (None, True),
        "u3": (NOW - 60, True),  # the end of its grace period
    }
    assert cluster.patches == {
        "j1-u1": [
            {"op": "test", "path": "/metadata/finalizers/1", "value": usage},
            {"op": "remove", "path": "/metadata/finalizers/1"},
        ],
        "j2-u3": [
            {"op": "test", "path": "/metadata/finalizers/0", "value": usage},
            {"op": "remove", "path": "/metadata/finalizers/0"},
        ],
        "j3-u4": [
            {"op": "test", "path": "/metadata/finalizers/0", "value": usage},
            {"op": "remove", "path": "/metadata/finalizers/0"},
        ],
    }
