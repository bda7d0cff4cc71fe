"""gpupool on KAI-Scheduler's real components (v0.12.0, built from its Go module, started by
tests/cluster/kai.py as its operator deploys them; this module's fixture only).

What is real: KAI's admission webhook, pod grouper, scheduler (its allocate and reclaim
actions, fair shares from the chart's queues, `--update-pod-eviction-condition`), binder (GPU
sharing: one reservation pod per shared GPU, the pods' GPU group and their GPU-sharing
ConfigMaps), the queue and pod-group controllers; the API server, the Job controller and its
podFailurePolicy; kwok nodes. SIMULATED: the reservation pod's program (it reads NVML and
annotates its pod with its GPU's UUID; kwok runs no program and there is no GPU here:
kai.ReservationStandIn does that write) and a container's exit (our kwok stages, plane.py).
Waits on KAI are real time and bounded; gpupool's own logic needs no clock here.

While these tests run, the session's two GPU nodes are cordoned and one 2-GPU kwok node
(`kai-node-0`) takes the work, so that a 2-GPU cluster is full with two jobs: KAI counts only
schedulable nodes in its fair shares, so the reclaim below happens exactly as it would on a
cluster of that size. kube-scheduler's `kai-scheduler` stand-in is off meanwhile.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import json
import threading
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import httpx
import pytest
from tornado import web

from gpupool.kube.objects import name_of
from gpupool.train.code import JobCode
from gpupool.train.request import JobRequest
from tests.cluster import build, kai
from tests.cluster.conftest import GPU_NODES, HUB_NS
from tests.cluster.plane import ControlPlane, env_flag
from tests.cluster.resources import Resources, gpu_node, until
from tests.cluster.test_train_jobs_real import (  # noqa: F401 (hub_api: a fixture)
    exit_pod,
    hub_api,
    make_service,
    pods_of,
    running_pod,
    volume_for,
    wait_for,
)

KAI_NODE = "kai-node-0"
MIN_RUNTIME_S = 10


def parse_time(stamp: str) -> datetime.datetime:
    return datetime.datetime.fromisoformat(stamp.replace("Z", "+00:00"))


@pytest.fixture(scope="module")
def kai_plane(
    plane: ControlPlane, chart: list[dict], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[SimpleNamespace]:
    """KAI's processes beside the plane for this module. If KAI does not build, its tests skip
    with the error (fail in CI); the rest of the plane never needs it."""
    try:
        build.optional("kai", log=lambda line: print(line, flush=True))
    except RuntimeError as err:
        if env_flag("CI"):
            pytest.fail(f"KAI-Scheduler could not be built: {err}")
        pytest.skip(f"KAI-Scheduler could not be built: {err}")
    with plane.client() as http:
        res = Resources(http)
        try:
            for i in range(GPU_NODES):
                cordon(res, f"gpu-node-{i}", True)
            res.apply(gpu_node(KAI_NODE, gpus=2))
            until(lambda: node_ready(res, KAI_NODE), 60, "the KAI test node to be Ready")
            kai.start(plane, tmp_path_factory.mktemp("kai"))
            with kai.ReservationStandIn(plane) as standin:
                yield SimpleNamespace(
                    plane=plane,
                    standin=standin,
                    log=lambda: "\n".join(
                        f"--- {n}\n{plane.log_tail(n, 1500)}"
                        for n in ("kai-scheduler", "kai-binder", "kai-podgrouper")
                    ),
                )
        finally:
            kai.stop(plane)
            for pod in res.get(f"/api/v1/pods?fieldSelector=spec.nodeName={KAI_NODE}")["items"]:
                res.http.delete(
                    f"/api/v1/namespaces/{pod['metadata']['namespace']}/pods/{pod['metadata']['name']}",
                    params={"gracePeriodSeconds": "0"},
                )
            res.http.delete(f"/api/v1/nodes/{KAI_NODE}")
            for i in range(GPU_NODES):
                cordon(res, f"gpu-node-{i}", False)


def cordon(res: Resources, node: str, on: bool) -> None:
    res.http.patch(
        f"/api/v1/nodes/{node}",
        json={"spec": {"unschedulable": on}},
        headers={"Content-Type": "application/merge-patch+json"},
    ).raise_for_status()


def node_ready(res: Resources, node: str) -> bool:
    return any(
        c["type"] == "Ready" and c["status"] == "True"
        for c in ((res.get(f"/api/v1/nodes/{node}") or {}).get("status") or {}).get("conditions") or []
    )


def reservation_pods(res: Resources) -> list[dict]:
    return res.get(f"/api/v1/namespaces/{kai.RESERVATION_NS}/pods")["items"]


async def test_kai_binds_two_quarter_gpu_workspaces_onto_one_gpu_with_its_reservation_pod(
    kai_plane: SimpleNamespace, make_spawner, admin: Resources
) -> None:
    """GPUKubeSpawner as the hub's account, two 0.25-GPU workspaces of one user in the chart's
    queue: KAI (not kube-scheduler: it is not serving `kai-scheduler` now) groups, places and
    binds them onto one GPU of the node, reserved by one reservation pod; the third workspace
    is refused by the build quota before anything reaches the API server."""
    a, b = make_spawner("ann", server="a"), make_spawner("ann", server="b")
    await asyncio.wait_for(a.start(), 90)
    await asyncio.wait_for(b.start(), 90)
    pods = [admin.get(f"/api/v1/namespaces/{HUB_NS}/pods/{sp.pod_name}") for sp in (a, b)]
    for pod in pods:
        assert pod["status"]["phase"] == "Running" and pod["spec"]["nodeName"] == KAI_NODE
        assert pod["spec"]["schedulerName"] == "kai-scheduler"
        assert pod["metadata"]["labels"][kai.QUEUE_LABEL] == "default"
    # KAI's binder put both into one GPU group: one shared device
    groups = {pod["metadata"]["labels"].get(kai.GPU_GROUP) for pod in pods}
    assert len(groups) == 1 and None not in groups, groups
    group = groups.pop()
    reservations = [p for p in reservation_pods(admin) if p["metadata"]["labels"].get(kai.GPU_GROUP) == group]
    assert len(reservations) == 1 and reservations[0]["spec"]["nodeName"] == KAI_NODE
    uuid = reservations[0]["metadata"]["annotations"][kai.GPU_INDEX]
    assert (reservations[0]["metadata"]["name"], uuid) in kai_plane.standin.annotated  # the simulated write
    # KAI's PodGroups, made by its pod grouper, in the chart's queue, with the build class
    groups_api = f"/apis/scheduling.run.ai/v2alpha2/namespaces/{HUB_NS}/podgroups"
    pgs = {o["metadata"]["name"]: o for o in admin.get(groups_api)["items"]}
    for pod in pods:
        pg = pgs[pod["metadata"]["annotations"]["pod-group-name"]]
        assert pg["spec"]["queue"] == "default" and pg["spec"]["priorityClassName"] == "build", pg["spec"]
    # the pod's environment: gpupool's own, plus KAI's GPU-sharing ConfigMaps with the device
    env = {e["name"]: e for e in pods[0]["spec"]["containers"][0]["env"]}
    # KAI's admission adds its own variables beside gpupool's: none twice (the last would win)
    assert len(env) == len(pods[0]["spec"]["containers"][0]["env"]), sorted(env)
    assert env["GPUPOOL_GPU_FRACTION"]["value"] == "0.25"
    assert not {"CUDA_VISIBLE_DEVICES", "PYTHONPATH", "GPUPOOL_GPU_UUIDS"} & set(env)
    cm_name = pods[0]["metadata"]["annotations"]["runai/shared-gpu-configmap"] + "-0"
    cm = admin.get(f"/api/v1/namespaces/{HUB_NS}/configmaps/{cm_name}")
    assert cm["data"]["NVIDIA_VISIBLE_DEVICES"] == uuid, cm["data"]
    assert float(cm["data"]["GPU_PORTION"]) == 0.25, cm["data"]
    # the build quota (0.5 GPU, two workspaces) holds: a third is refused before any create
    c = make_spawner("ann", server="c")
    asked = kai_plane.plane.created("pods", HUB_NS).count(c.pod_name)  # earlier tests may have used the name
    with pytest.raises(web.HTTPError) as err:
        await c.start()
    assert err.value.status_code == 403 and "2 GPU workspace(s) at once" in err.value.jupyterhub_message
    assert kai_plane.plane.created("pods", HUB_NS).count(c.pod_name) == asked  # never asked for
    await a.stop()
    await b.stop()
    # with no pod left in its GPU group, KAI's binder lets the reservation go
    until(
        lambda: (
            not [p for p in reservation_pods(admin) if p["metadata"]["labels"].get(kai.GPU_GROUP) == group]
        ),
        60,
        "the reservation pod to go",
        kai_plane.log,
    )


# --- KAI's reclaim ------------------------------------------------------------------------
CASES = {  # case -> (borrower's department, owner's department, whose minRuntime)
    "reclaim": ("rc-d", "rc-d", ""),
    "project-min-runtime": ("rp-d", "rp-d", "project"),
    "department-min-runtime": ("rd-a", "rd-b", "department"),
}


def chart_queues(case: str) -> tuple[str, str, list[dict]]:
    """The chart's own Queue objects (rendered with helm-python-sdk, as the session's chart is)
    for `case`: two projects guaranteed 1 GPU each, the borrower and the owner, in one
    department of 2 GPUs or in two of 1 GPU each; the borrower's project (its queue's
    reclaimMinRuntime: KAI reads it when a sibling reclaims) or its department (read when a job
    of another department reclaims: KAI resolves at the level below the lowest common ancestor)
    given MIN_RUNTIME_S. Returns (borrower, owner, queues)."""
    from tests.k8s.test_chart import render

    mine, theirs, who = CASES[case]
    borrower, owner = f"{mine}-a", f"{mine}-b"
    departments = {d: {"quota": 2 if mine == theirs else 1, "limit": -1} for d in {mine, theirs}}
    projects = {
        borrower: {"department": mine, "guarantee": 1, "limit": -1},
        owner: {"department": theirs, "guarantee": 1, "limit": -1},
    }
    if who == "project":
        projects[borrower]["minRuntime"] = f"{MIN_RUNTIME_S}s"
    if who == "department":
        departments[mine]["minRuntime"] = f"{MIN_RUNTIME_S}s"
    values = {"departments": departments, "projects": projects, "build": {"defaultProject": borrower}}
    names = {borrower, owner} | {f"department-{d}" for d in departments}
    return (
        borrower,
        owner,
        [d for d in render(values) if d["kind"] == "Queue" and d["metadata"]["name"] in names],
    )


class PodHistory:
    """Every version of the pods matching `selector` the API server reports (a watch): an evicted
    pod lives for a moment only, its conditions are read here."""

    def __init__(self, plane: ControlPlane, selector: str) -> None:
        self.plane, self.selector, self.versions = plane, selector, []
        self.thread = threading.Thread(target=self._run, daemon=True, name="pod-history")
        self.thread.start()

    def _run(self) -> None:
        params = {"watch": "1", "labelSelector": self.selector, "timeoutSeconds": "240"}
        with (
            self.plane.client() as http,
            contextlib.suppress(httpx.HTTPError),
            http.stream("GET", f"/api/v1/namespaces/{HUB_NS}/pods", params=params, timeout=None) as r,
        ):
            for line in r.iter_lines():
                if line:
                    self.versions.append(json.loads(line)["object"])

    def disruption(self, uid: str) -> dict:
        """The DisruptionTarget condition a version of the pod `uid` carried ({} if none did)."""
        for pod in self.versions:
            if pod["metadata"]["uid"] == uid:
                for cond in (pod.get("status") or {}).get("conditions") or []:
                    if cond["type"] == "DisruptionTarget" and cond["status"] == "True":
                        return cond
        return {}


@pytest.mark.parametrize("case", list(CASES))
async def test_kai_reclaims_a_borrowed_gpu_and_the_job_resumes_without_a_failure(
    kai_plane: SimpleNamespace, hub_api, admin: Resources, tmp_path: Path, case: str
) -> None:
    """The hub's training service (Kubernetes mode, KAI sharing, as the hub's account): project
    A (guarantee 1) runs two 1-GPU jobs on the 2-GPU cluster, one borrowed; project B
    (guarantee 1) submits one: KAI's reclaim evicts one of A's pods, with the DisruptionTarget
    condition (its scheduler runs with --update-pod-eviction-condition), the Job ignores that
    failure (gpupool's podFailurePolicy) and makes a new pod, which waits until B's job ends,
    then runs and succeeds. The pod's exit on SIGTERM is our kwok stage's 143: without the
    condition it would fail the Job. With a `minRuntime` where KAI reads it (the borrower's
    project when B is its sibling, the borrower's department when B is in another), KAI waits
    until the borrowed pod has run that long; without any, it reclaims at once (the control)."""
    borrower, owner, queues = chart_queues(case)
    min_runtime_s = MIN_RUNTIME_S if CASES[case][2] else 0
    admin.apply_all(queues)
    projects = {borrower: {"guarantee": 1}, owner: {"guarantee": 1}}
    svc = make_service(tmp_path, hub_api, projects=projects)
    history = PodHistory(kai_plane.plane, "gpupool.io/job-id")
    for i in range(
        3
    ):  # PVs first: a claim made before its PV binds only at the PV controller's next resync (15 s)
        volume_for(admin, f"kai-{case}-{i}")
    await svc.start()
    rows = []
    try:
        for name in ("a1", "a2"):
            rows.append(
                await svc.submit(
                    JobRequest(
                        owner="ann",
                        project=borrower,
                        name=name,
                        num_gpu=1,
                        gpu_milli=1000,
                        code=JobCode.command(["python", "train.py"]),
                    )
                )
            )
        first = {}
        for row in rows:
            first[row.id] = await wait_for(
                lambda r=row: running_pod(admin, r.id, set()),
                60,
                f"{row.name} to run (A borrows the second GPU)\n{kai_plane.log()}",
            )
            assert first[row.id]["spec"]["nodeName"] == KAI_NODE
            assert first[row.id]["spec"]["schedulerName"] == "kai-scheduler"
        await wait_for(lambda: all(svc.job(r.id).state == "running" for r in rows), 30, "A's rows running")

        rows.append(
            await svc.submit(
                JobRequest(
                    owner="bob",
                    project=owner,
                    name="b1",
                    num_gpu=1,
                    gpu_milli=1000,
                    code=JobCode.command(["python", "train.py"]),
                )
            )
        )
        b = rows[-1]
        b_pod = await wait_for(
            lambda: running_pod(admin, b.id, set()),
            90,
            f"B's job to run after KAI's reclaim\n{kai_plane.log()}",
        )
        await wait_for(lambda: any(svc.job(r.id).preemptions for r in rows[:2]), 30, "A's row to show it")
        victims = [r for r in rows[:2] if svc.job(r.id).preemptions]
        assert len(victims) == 1, [svc.job(r.id) for r in rows]  # KAI takes back what B is owed, no more
        victim, survivor = victims[0].id, next(r.id for r in rows[:2] if r is not victims[0])
        evicted = first[victim]["metadata"]["uid"]
        cond = history.disruption(evicted)
        assert cond, "KAI deleted the pod without the DisruptionTarget condition"
        ran_s = (
            parse_time(cond["lastTransitionTime"]) - parse_time(first[victim]["status"]["startTime"])
        ).total_seconds()
        if min_runtime_s:
            assert ran_s >= min_runtime_s - 1, f"evicted after {ran_s} s, before its minRuntime"
        else:
            assert ran_s < MIN_RUNTIME_S - 1, f"evicted only after {ran_s} s"  # the control: at once
        job = admin.get(f"/apis/batch/v1/namespaces/{HUB_NS}/jobs/{name_of(victim)}")
        assert not job["status"].get("failed") and not [
            c for c in job["status"].get("conditions") or [] if c["type"] == "Failed"
        ], job["status"]
        # the hub's row: waiting again, to resume from its checkpoint; the other A job runs on
        assert svc.job(victim).state == "queued" and svc.job(survivor).state == "running"
        assert running_pod(admin, victim, {evicted}) is None  # its new pod waits: the cluster is full

        # B's job ends; KAI binds A's new pod, which (as the checkpoint helper would) resumes and ends
        exit_pod(admin, b_pod, 0)
        again = await wait_for(
            lambda: running_pod(admin, victim, {evicted}), 90, f"A's new pod to run\n{kai_plane.log()}"
        )
        await wait_for(
            lambda: svc.job(victim).state == "running" and svc.job(victim).runs == 2,
            30,
            "the row running again",
        )  # the controller's pass is every 0.5 s: exit only after it
        exit_pod(admin, again, 0)
        await wait_for(lambda: svc.job(victim).state == "succeeded", 60, "succeeded")
        assert (svc.job(victim).runs, svc.job(victim).preemptions) == (2, 1)
        # queued -> running -> preempted (queued again) -> running -> succeeded, as the hub recorded it
        kinds = [e.kind for e in reversed(svc.pool.store.events(name=victim))]
        assert kinds == ["job", "start", "preempt", "resume", "job"], kinds
    finally:
        for row in rows:
            if svc.job(row.id).state not in ("succeeded", "failed", "cancelled"):
                await svc.cancel(row.id)
        await svc.stop()


# --- node pools: KAI's scheduling shards --------------------------------------------------
POOL_NODES = {
    "dgx": ("kai-dgx-0", "NVIDIA-H100-80GB-HBM3", 81559),
    "ws": ("kai-ws-0", "NVIDIA-RTX-A2000", 12282),
}
POOL_VALUES = {
    "departments": {"lab": {"quota": 4}},
    "projects": {
        "vision": {"department": "lab", "guarantee": {"dgx": 1, "ws": 1}},
        "course": {"department": "lab", "guarantee": 1, "pools": ["ws"]},
        "flat": {"department": "lab", "guarantee": 1},
    },
    "nodePools": {"dgx": {"models": ["NVIDIA H100 80GB HBM3"]}, "ws": {}},
    "build": {"defaultProject": "course"},
}


@pytest.fixture(scope="module")
def kai_pools(kai_plane: SimpleNamespace) -> Iterator[SimpleNamespace]:
    """The chart's objects for two node pools: its queues and a SchedulingShard per pool, each
    shard run as KAI's operator runs it (kai.start_shard), and a 2-GPU node per pool labelled
    kai.scheduler/node-pool=<pool>, as the chart's NOTES tell the admin to."""
    from tests.k8s.test_chart import render

    docs = render(POOL_VALUES)
    with kai_plane.plane.client() as http:
        res = Resources(http)
        try:
            res.apply_all(d for d in docs if d["kind"] == "Queue")
            for pool, (node, product, memory) in POOL_NODES.items():
                doc = gpu_node(node, gpus=2, product=product, memory_mib=memory)
                doc["metadata"]["labels"][kai.NODE_POOL_LABEL] = pool
                res.apply(doc)
            until(
                lambda: all(node_ready(res, n) for n, _, _ in POOL_NODES.values()), 60, "the pool nodes Ready"
            )
            shards = [d for d in docs if d["kind"] == "SchedulingShard"]
            for shard in shards:
                kai.start_shard(kai_plane.plane, shard)
            yield SimpleNamespace(docs=docs, shards=shards)
        finally:
            for node, _, _ in POOL_NODES.values():
                for pod in res.get(f"/api/v1/pods?fieldSelector=spec.nodeName={node}")["items"]:
                    res.http.delete(
                        f"/api/v1/namespaces/{pod['metadata']['namespace']}/pods/{pod['metadata']['name']}",
                        params={"gracePeriodSeconds": "0"},
                    )
                res.http.delete(f"/api/v1/nodes/{node}")


def pool_config(c) -> None:
    c.TrainPool.node_pools = POOL_VALUES["nodePools"]
    c.GPUPool.build_pools = ["ws"]  # everyone's workspaces on the workstations


async def test_node_pools_are_kai_shards_and_each_workspace_and_job_runs_in_its_own(
    kai_plane: SimpleNamespace,
    kai_pools: SimpleNamespace,
    make_spawner,
    hub_api,
    admin: Resources,
    tmp_path: Path,
) -> None:
    """KAI's default shard ignores nodes labelled kai.scheduler/node-pool; each pool's shard sees
    only its own nodes, queues and PodGroups. A workspace on pool ws and train jobs of projects
    with pools carry the label and their project's queue there, so that pool's real scheduler
    places them on its node; a job of a project without pools runs in the default shard; and a
    job the pool cannot hold waits with KAI's own reason, which the hub shows as its wait reason.
    Before the fix neither had the label: KAI's default shard left them Pending for ever."""
    from gpupool.train.waiting import explain

    ws, dgx = POOL_NODES["ws"][0], POOL_NODES["dgx"][0]
    sp = make_spawner(
        "pia",
        server="",
        kai_queue="{group}",
        kai_queue_groups=["course", "vision", "flat"],
        kai_default_group="course",
        more=pool_config,
    )
    await asyncio.wait_for(sp.start(), 90)
    pod = admin.get(f"/api/v1/namespaces/{HUB_NS}/pods/{sp.pod_name}")
    assert pod["spec"]["nodeName"] == ws and pod["status"]["phase"] == "Running"
    assert (pod["metadata"]["labels"][kai.QUEUE_LABEL], pod["metadata"]["labels"][kai.NODE_POOL_LABEL]) == (
        "course-ws",
        "ws",
    )
    pg = admin.get(
        f"/apis/scheduling.run.ai/v2alpha2/namespaces/{HUB_NS}/podgroups/{pod['metadata']['annotations']['pod-group-name']}"
    )
    assert pg["spec"]["queue"] == "course-ws" and pg["metadata"]["labels"][kai.NODE_POOL_LABEL] == "ws"

    projects = {
        "vision": {"guarantee": {"dgx": 1, "ws": 1}},
        "course": {"guarantee": 1, "pools": ["ws"]},
        "flat": {"guarantee": 1},
    }
    svc = make_service(tmp_path, hub_api, projects=projects, train={"node_pools": POOL_VALUES["nodePools"]})
    await svc.start()
    rows = []
    try:
        for project, name in (("vision", "v1"), ("vision", "v2"), ("flat", "f1"), ("course", "c1")):
            rows.append(
                await svc.submit(
                    JobRequest(
                        owner="ann",
                        project=project,
                        name=name,
                        num_gpu=1,
                        gpu_milli=1000,
                        code=JobCode.command(["python", "train.py"]),
                    )
                )
            )
            volume_for(admin, rows[-1].id)
        v1, v2, f1, c1 = rows
        placed = {}
        for row in (v1, v2, f1):
            placed[row.id] = await wait_for(
                lambda r=row: running_pod(admin, r.id, set()), 60, f"{row.name} to run\n{kai_plane.log()}"
            )
        # vision: its DGX guarantee first, then the workstations'; flat: the default shard's node
        assert [placed[r.id]["spec"]["nodeName"] for r in (v1, v2, f1)] == [dgx, ws, KAI_NODE]
        assert [placed[r.id]["metadata"]["labels"].get(kai.QUEUE_LABEL) for r in (v1, v2, f1)] == [
            "vision-dgx",
            "vision-ws",
            "flat",
        ]
        assert kai.NODE_POOL_LABEL not in placed[f1.id]["metadata"]["labels"]
        # course's job: its shard (ws) has 0.75 of a GPU left beside the workspace and vision's job
        try:
            pending = await wait_for(
                lambda: (
                    svc.job(c1.id).message.startswith("waiting for GPUs in queue course-ws: ")
                    and svc.job(c1.id)
                ),
                90,
                "KAI's reason for c1",
            )
        except AssertionError as err:  # say what there was instead
            raise AssertionError(
                f"{err}: row {svc.job(c1.id).state} {svc.job(c1.id).message!r}, pods"
                f" {[p['status'] for p in pods_of(admin, c1.id)]}\n{kai_plane.log()}"
            ) from None
        assert pending.state == "queued" and running_pod(admin, c1.id, set()) is None
        pods = pods_of(admin, c1.id)
        cond = next(c for c in pods[-1]["status"]["conditions"] if c["type"] == "PodScheduled")
        assert cond["status"] == "False" and " ".join(cond["message"].split())[:60] in pending.message
        assert explain(svc, pending) == pending.message  # the API's wait_reason: the cluster's words
    finally:
        for row in rows:
            await svc.cancel(row.id)
        await svc.stop()
        await sp.stop()


async def test_elastic_jobs_are_refused_on_a_kai_that_cannot_gang_them(
    kai_plane: SimpleNamespace, hub_api, admin: Resources, tmp_path: Path
) -> None:
    """Elastic jobs need KAI v0.14.1+ (one PodGroup per Job, minMember from
    kai.scheduler/batch-min-member). The hub reads the running KAI's version from its pod-grouper
    Deployment (the harness writes it as KAI's operator does, with the pinned version's image):
    on the pinned KAI the job is refused with the reason, and nothing reaches the API server;
    where the admin states a KAI that can (the chart's kai.version), it is sent with its minimum."""
    from gpupool.pool import InvalidRequest

    version = kai.pin().version
    # an elastic job of 1 to 2 whole GPUs, sent to both hubs
    elastic = JobRequest(
        owner="ann",
        project="default",
        name="elastic",
        num_gpu=2,
        gpu_milli=1000,
        code=JobCode.command(["python", "train.py"]),
        min_gpus=1,
    )
    svc = make_service(tmp_path, hub_api, projects={"default": {"guarantee": 2}})
    await svc.start()
    try:
        with pytest.raises(InvalidRequest) as err:
            await svc.submit(elastic)
        assert svc.kai is not None and svc.kai.text == version  # read from the cluster
        assert f"this cluster runs {version} (deployment kai-scheduler/pod-grouper)" in str(err.value)
        assert "need KAI-Scheduler v0.14.1 or later" in str(err.value)
        assert not [j for j in svc.jobs() if j.name == "elastic"]  # refused before anything was recorded
    finally:
        await svc.stop()
    (tmp_path / "stated").mkdir()
    stated = make_service(
        tmp_path / "stated", hub_api, projects={"default": {"guarantee": 2}}, kai_version="v0.17.0"
    )
    await stated.start()
    try:
        row = await stated.submit(elastic)
        job = admin.get(f"/apis/batch/v1/namespaces/{HUB_NS}/jobs/{name_of(row.id)}")
        assert job["metadata"]["annotations"]["kai.scheduler/batch-min-member"] == "1"
        await stated.cancel(row.id)
    finally:
        await stated.stop()


async def test_a_cpu_only_workspace_waits_in_its_queue_with_the_build_class(
    kai_plane: SimpleNamespace, make_spawner, admin: Resources
) -> None:
    """A profile without a GPU: the pod still names its queue and the build class, so KAI
    places it there (before: no queue label, KAI put it in `default-queue`, which this cluster
    does not have, as preemptible `train`, and it stayed Pending)."""
    profiles = [{"display_name": "CPU only", "slug": "cpu", "default": True}]
    sp = make_spawner("cpu-ann", options={"profile": "cpu"}, profile_list=profiles)
    await asyncio.wait_for(sp.start(), 90)
    pod = admin.get(f"/api/v1/namespaces/{HUB_NS}/pods/{sp.pod_name}")
    assert pod["status"]["phase"] == "Running" and pod["spec"]["nodeName"] == KAI_NODE
    assert (
        pod["metadata"]["labels"][kai.QUEUE_LABEL] == "default"
        and pod["spec"]["priorityClassName"] == "build"
    )
    pg = admin.get(
        f"/apis/scheduling.run.ai/v2alpha2/namespaces/{HUB_NS}/podgroups/"
        f"{pod['metadata']['annotations']['pod-group-name']}"
    )
    assert (pg["spec"]["queue"], pg["spec"]["priorityClassName"]) == ("default", "build")
    assert (
        "gpu-fraction" not in (pod["metadata"].get("annotations") or {}) and sp.pool.store.allocations() == []
    )
    await sp.stop()


def test_helm_test_finds_what_the_hub_needs_and_names_what_is_missing(
    kai_plane: SimpleNamespace, kai_pools: SimpleNamespace, admin: Resources, tmp_path: Path
) -> None:
    """The chart's `helm test` pod's check (python -m gpupool.kube.check), run as its own
    service account with the chart's hook RBAC and the environment the chart renders: on this
    cluster it finds the queues, classes, both pools' shards and labelled nodes and KAI's
    version; a third pool nobody labelled nodes for fails it, saying what to do."""
    import os
    import subprocess
    import sys

    from tests.k8s.test_chart import render

    def run(values: dict) -> subprocess.CompletedProcess:
        docs = render(values, hooks=True)
        # the hook's RBAC (not its Pod: its check runs here), the queues and shards, and the hub's
        # Role that the hook's RoleBinding names (reading KAI's pod-grouper Deployment)
        admin.apply_all(
            d
            for d in docs
            if (d["kind"] != "Pod" and d["metadata"].get("annotations", {}).get("helm.sh/hook") == "test")
            or d["kind"] in ("Queue", "SchedulingShard")
            or d["metadata"]["name"] == "gpupool-hub-kai-version"
        )
        pod = next(d for d in docs if d["kind"] == "Pod" and d["metadata"]["name"] == "gpupool-test")
        env = {e["name"]: e["value"] for e in pod["spec"]["containers"][0]["env"]}
        kubeconfig = kai_plane.plane.sa_kubeconfig(tmp_path / "test.kubeconfig", "gpupool", "gpupool-test")
        return subprocess.run(
            [sys.executable, "-m", "gpupool.kube.check"],
            capture_output=True,
            text=True,
            timeout=60,
            env={**os.environ, **env, "KUBECONFIG": str(kubeconfig)},
        )

    # the chart's two pools, found with their shards and labelled nodes, and a third pool nobody
    # labelled nodes for: one run (a process start is seconds on a loaded machine)
    out = run(
        {
            **POOL_VALUES,
            "priorityClasses": {"create": True},
            "nodePools": {**POOL_VALUES["nodePools"], "cloud": {}},
        }
    )
    assert out.returncode == 1, out.stdout + out.stderr
    lines = out.stdout.splitlines()
    assert [line for line in lines if line.startswith("FAIL")] == [
        "FAIL: node pool cloud has no node: label its nodes (kubectl label nodes NODE kai.scheduler/node-pool=cloud);"
        " its workspaces and jobs stay Pending until then"
    ], lines
    assert "ok: node pool ws: 1 node(s) labelled kai.scheduler/node-pool=ws" in lines
    assert "ok: node pool dgx: 1 node(s) labelled kai.scheduler/node-pool=dgx" in lines
    assert any(line.startswith("ok: ") and "queues" in line for line in lines)
    assert (
        f"ok: KAI-Scheduler {kai.pin().version} (elastic jobs are refused: they need v0.14.1 or later)"
        in lines
    )
