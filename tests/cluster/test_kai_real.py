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
from gpupool.kube.objects import name_of
from tornado import web

from tests.cluster import build, kai
from tests.cluster.conftest import GPU_NODES, HUB_NS
from tests.cluster.plane import ControlPlane, env_flag
from tests.cluster.resources import Resources, gpu_node, until
from tests.cluster.test_train_jobs_real import (  # noqa: F401 (hub_api: a fixture)
    exit_pod,
    hub_api,
    make_service,
    running_pod,
    volume_for,
    wait_for,
)

KAI_NODE = "kai-node-0"
MIN_RUNTIME_S = 15


def parse_time(stamp: str) -> datetime.datetime:
    return datetime.datetime.fromisoformat(stamp.replace("Z", "+00:00"))


@pytest.fixture(scope="module")
def kai_plane(plane: ControlPlane, chart: list[dict], tmp_path_factory: pytest.TempPathFactory) -> Iterator[SimpleNamespace]:
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
                yield SimpleNamespace(plane=plane, standin=standin,
                                      log=lambda: "\n".join(f"--- {n}\n{plane.log_tail(n, 1500)}" for n in
                                                            ("kai-scheduler", "kai-binder", "kai-podgrouper")))
        finally:
            kai.stop(plane)
            for pod in res.get(f"/api/v1/pods?fieldSelector=spec.nodeName={KAI_NODE}")["items"]:
                res.http.delete(f"/api/v1/namespaces/{pod['metadata']['namespace']}/pods/{pod['metadata']['name']}",
                                params={"gracePeriodSeconds": "0"})
            res.http.delete(f"/api/v1/nodes/{KAI_NODE}")
            for i in range(GPU_NODES):
                cordon(res, f"gpu-node-{i}", False)


def cordon(res: Resources, node: str, on: bool) -> None:
    res.http.patch(f"/api/v1/nodes/{node}", json={"spec": {"unschedulable": on}},
                   headers={"Content-Type": "application/merge-patch+json"}).raise_for_status()


def node_ready(res: Resources, node: str) -> bool:
    return any(c["type"] == "Ready" and c["status"] == "True"
               for c in ((res.get(f"/api/v1/nodes/{node}") or {}).get("status") or {}).get("conditions") or [])


def reservation_pods(res: Resources) -> list[dict]:
    return res.get(f"/api/v1/namespaces/{kai.RESERVATION_NS}/pods")["items"]


async def test_kai_binds_two_quarter_gpu_workspaces_onto_one_gpu_with_its_reservation_pod(
        kai_plane: SimpleNamespace, make_spawner, admin: Resources) -> None:
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
    until(lambda: not [p for p in reservation_pods(admin) if p["metadata"]["labels"].get(kai.GPU_GROUP) == group],
          60, "the reservation pod to go", kai_plane.log)


# --- KAI's reclaim ------------------------------------------------------------------------
DEPARTMENT, BORROWER, OWNER = "reclaim", "reclaim-a", "reclaim-b"


def chart_queues(min_runtime_s: int = 0) -> list[dict]:
    """The chart's own Queue objects for a department of 2 GPUs and two projects guaranteed 1
    GPU each (rendered with helm-python-sdk, as the session's chart is); the borrower's jobs
    protected for `min_runtime_s` (the project's `minRuntime`) if given."""
    from tests.k8s.test_chart import render

    values = {"departments": {DEPARTMENT: {"quota": 2, "limit": -1}},
              "projects": {p: {"department": DEPARTMENT, "guarantee": 1, "limit": -1} for p in (BORROWER, OWNER)}}
    if min_runtime_s:
        values["projects"][BORROWER]["minRuntime"] = f"{min_runtime_s}s"
    return [d for d in render(values) if d["kind"] == "Queue"
            and d["metadata"]["name"] in (f"department-{DEPARTMENT}", BORROWER, OWNER)]


class PodHistory:
    """Every version of the pods matching `selector` the API server reports (a watch): an evicted
    pod lives for a moment only, its conditions are read here."""

    def __init__(self, plane: ControlPlane, selector: str) -> None:
        self.plane, self.selector, self.versions = plane, selector, []
        self.thread = threading.Thread(target=self._run, daemon=True, name="pod-history")
        self.thread.start()

    def _run(self) -> None:
        params = {"watch": "1", "labelSelector": self.selector, "timeoutSeconds": "240"}
        with (self.plane.client() as http, contextlib.suppress(httpx.HTTPError),
              http.stream("GET", f"/api/v1/namespaces/{HUB_NS}/pods", params=params, timeout=None) as r):
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


@pytest.mark.parametrize("min_runtime_s", [0, MIN_RUNTIME_S], ids=["reclaim", "after-min-runtime"])
async def test_kai_reclaims_a_borrowed_gpu_and_the_job_resumes_without_a_failure(
        kai_plane: SimpleNamespace, hub_api, admin: Resources, tmp_path: Path, min_runtime_s: int) -> None:  # noqa: F811
    """The hub's training service (Kubernetes mode, KAI sharing, as the hub's account): project
    A (guarantee 1) runs two 1-GPU jobs on the 2-GPU cluster, one borrowed; project B
    (guarantee 1) submits one: KAI's reclaim evicts one of A's pods, with the DisruptionTarget
    condition (its scheduler runs with --update-pod-eviction-condition), the Job ignores that
    failure (gpupool's podFailurePolicy) and makes a new pod, which waits until B's job ends,
    then runs and succeeds. The pod's exit on SIGTERM is our kwok stage's 143: without the
    condition it would fail the Job. With the project's `minRuntime` (the chart renders KAI's
    reclaimMinRuntime), KAI waits until the borrowed pod has run that long; without it, it
    reclaims at once (the control)."""
    admin.apply_all(chart_queues(min_runtime_s))
    projects = {BORROWER: {"guarantee": 1}, OWNER: {"guarantee": 1}}
    svc = make_service(tmp_path, hub_api, projects=projects)
    history = PodHistory(kai_plane.plane, "gpupool.io/job-id")
    for i in range(3):  # PVs first: a claim made before its PV binds only at the PV controller's next resync (15 s)
        volume_for(admin, f"kai{min_runtime_s}-{i}")
    await svc.start()
    rows = []
    try:
        for name in ("a1", "a2"):
            rows.append(await svc.submit("ann", BORROWER, name, 1, 1000, ["python", "train.py"]))
        first = {}
        for row in rows:
            first[row.id] = await wait_for(lambda r=row: running_pod(admin, r.id, set()), 60,
                                           f"{row.name} to run (A borrows the second GPU)\n{kai_plane.log()}")
            assert first[row.id]["spec"]["nodeName"] == KAI_NODE
            assert first[row.id]["spec"]["schedulerName"] == "kai-scheduler"
        await wait_for(lambda: all(svc.job(r.id).state == "running" for r in rows), 30, "A's rows running")

        rows.append(await svc.submit("bob", OWNER, "b1", 1, 1000, ["python", "train.py"]))
        b = rows[-1]
        b_pod = await wait_for(lambda: running_pod(admin, b.id, set()), 90,
                               f"B's job to run after KAI's reclaim\n{kai_plane.log()}")
        await wait_for(lambda: any(svc.job(r.id).preemptions for r in rows[:2]), 30, "A's row to show it")
        victims = [r for r in rows[:2] if svc.job(r.id).preemptions]
        assert len(victims) == 1, [svc.job(r.id) for r in rows]  # KAI takes back what B is owed, no more
        victim, survivor = victims[0].id, next(r.id for r in rows[:2] if r is not victims[0])
        evicted = first[victim]["metadata"]["uid"]
        cond = history.disruption(evicted)
        assert cond, "KAI deleted the pod without the DisruptionTarget condition"
        ran_s = (parse_time(cond["lastTransitionTime"]) - parse_time(first[victim]["status"]["startTime"])).total_seconds()
        if min_runtime_s:
            assert ran_s >= min_runtime_s - 1, f"evicted after {ran_s} s, before its minRuntime"
        else:
            assert ran_s < MIN_RUNTIME_S - 1, f"evicted only after {ran_s} s"  # the control: at once
        job = admin.get(f"/apis/batch/v1/namespaces/{HUB_NS}/jobs/{name_of(victim)}")
        assert not job["status"].get("failed") and not [c for c in job["status"].get("conditions") or []
                                                        if c["type"] == "Failed"], job["status"]
        # the hub's row: waiting again, to resume from its checkpoint; the other A job runs on
        assert svc.job(victim).state == "queued" and svc.job(survivor).state == "running"
        assert running_pod(admin, victim, {evicted}) is None  # its new pod waits: the cluster is full

        # B's job ends; KAI binds A's new pod, which (as the checkpoint helper would) resumes and ends
        exit_pod(admin, b_pod, 0)
        again = await wait_for(lambda: running_pod(admin, victim, {evicted}), 90,
                               f"A's new pod to run\n{kai_plane.log()}")
        await wait_for(lambda: svc.job(victim).state == "running" and svc.job(victim).runs == 2, 30,
                       "the row running again")  # the controller's pass is every 0.5 s: exit only after it
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
