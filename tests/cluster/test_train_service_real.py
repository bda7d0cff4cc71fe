"""The hub's training pool in Kubernetes mode (gpupool.train.kube_service) on the real control
plane, as the chart's hub account: a submission becomes a Job with its code in a ConfigMap the
Job owns, the job row follows what the real Job controller and kwok do, nothing is lost or sent
twice across a hub restart (Job creates counted in the API server's audit log), and a Job the
API server refuses fails its row with the server's reason. A job's GPU-hours in the usage report
come from its pods' lifetimes on the cluster (the hub's relist of train pods); over its owner's GPU-hour
budget a queued job's Job is suspended (no pod; a hub restart half-way finishes it) until a top-up,
a running one runs on. The last test runs a whole
JupyterHub in Kubernetes mode against the same plane.

Simulated, as in test_train_jobs_real.py: a container's exit (our kwok stage) and KAI's eviction
(done as KAI does it). A job's log comes through the real API server's `pods/log` from kwok, which serves
one file as every train pod's log (plane.POD_LOGS); the kept log's details (its cut, restarts,
several pods) are in tests/k8s/test_train_service.py."""

from __future__ import annotations

import base64
import time
from pathlib import Path

import pytest
from kubernetes_asyncio import client

from gpupool.kube.objects import code_name, name_of
from gpupool.kube.pod_usage import parse_time
from gpupool.store import PodSpanRow
from gpupool.train.code import JobCode
from gpupool.train.request import JobRequest
from gpupool.usage.config import Usage
from gpupool.usage.service import UsageService
from tests.cluster.conftest import HUB_NS
from tests.cluster.plane import ControlPlane
from tests.cluster.resources import Resources
from tests.cluster.test_train_jobs_real import (
    STORAGE,
    evict_as_kai,
    exit_pod,
    hub_api,  # noqa: F401 - the fixture
    make_service,
    pods_of,
    running_pod,
    volume_for,
    wait_for,
)
from tests.support.jobs import job_request
from tests.support.wait import until

JOBS = f"/apis/batch/v1/namespaces/{HUB_NS}/jobs"


def jobs_created(plane: ControlPlane, job_id: str) -> int:
    return plane.created("jobs", HUB_NS).count(name_of(job_id))


async def test_a_script_job_becomes_a_job_with_its_code_and_its_row_follows_the_cluster(
    hub_api, admin: Resources, tmp_path: Path
) -> None:
    service = make_service(tmp_path, hub_api, usage_finalizer=True)  # the hub's default
    await service.start()
    try:
        row = await service.submit(
            JobRequest(
                owner="ann",
                project="default",
                name="resnet",
                num_gpu=1,
                gpu_milli=500,
                code=JobCode.script(b"print('epoch 1')\n"),
            )
        )
        assert row.state == "queued" and "waiting for GPUs in queue default" in row.message
        volume_for(admin, row.id)
        job = admin.get(f"{JOBS}/{name_of(row.id)}")
        container = job["spec"]["template"]["spec"]["containers"][0]
        assert container["command"] == ["python", "job.py"]  # the image's python, not the hub's
        assert job["spec"]["template"]["metadata"]["annotations"]["gpu-fraction"] == "0.5"
        assert container["workingDir"] == "/gpupool/job"
        assert {
            "name": "code",
            "mountPath": "/gpupool/job/job.py",
            "subPath": "job.py",
            "readOnly": True,
        } in container["volumeMounts"]
        code = admin.get(f"/api/v1/namespaces/{HUB_NS}/configmaps/{code_name(row.id)}")
        assert base64.b64decode(code["binaryData"]["job.py"]) == b"print('epoch 1')\n"
        assert code["metadata"]["ownerReferences"][0]["uid"] == job["metadata"]["uid"]  # deleted with its Job
        assert not Path(row.workdir).exists()  # the cluster holds the code: nothing left on the hub's volume

        first = await wait_for(lambda: running_pod(admin, row.id, set()), what="the pod to run")
        await wait_for(lambda: service.job(row.id).state == "running", what="row running")
        assert service.job(row.id).started is not None
        # one pass of the hub's periodic relist of train pods, its clock ten minutes on: the pod
        # is seen alive then, and KAI deletes it before the next pass
        seen = int(time.time()) + 600
        await service.record_usage(now=seen)
        evict_as_kai(admin, first)  # KAI reclaims the GPU for another queue's guarantee
        second = await wait_for(
            lambda: running_pod(admin, row.id, {first["metadata"]["uid"]}), what="the replacement pod"
        )
        await wait_for(
            lambda: service.job(row.id).state == "running" and service.job(row.id).runs == 2, what="resumed"
        )
        got = service.job(row.id)
        assert (got.preemptions, got.message) == (1, "resumed from its checkpoint")
        exit_pod(admin, second, 0)
        await wait_for(lambda: service.job(row.id).state == "succeeded", what="succeeded")
        assert service.job(row.id).finished is not None
        kinds = [e.kind for e in reversed(service.pool.store.events(name=row.id))]
        assert kinds == ["job", "start", "preempt", "resume", "job"]
        # its GPU-hours, from both pods' lifetimes on the cluster (it held no hub allocation). The
        # evicted pod was deleted between two passes: the usage finalizer kept it (Terminating,
        # its container ended) until this pass read its end, exactly; then the hub let it go
        pod_at = f"/api/v1/namespaces/{HUB_NS}/pods/{first['metadata']['name']}"
        kept = admin.get(pod_at)
        assert kept is not None and kept["metadata"].get("deletionTimestamp")
        assert "gpupool.io/usage" in kept["metadata"]["finalizers"]
        ended = kept["status"]["containerStatuses"][0]["state"]["terminated"]["finishedAt"]
        await service.record_usage()
        await wait_for(lambda: admin.get(pod_at) is None, what="the evicted pod gone once recorded")
        usage = UsageService(service.pool, Usage())
        spans = sorted((h for h in usage.ledger.held(0, 2**31) if h.name == row.id), key=lambda h: h.start)
        assert {(h.kind, h.milli, h.project) for h in spans} == {("train", 500, "default")}
        assert (
            [h.end for h in spans][:1] == [parse_time(ended)] and len(spans) == 2 and spans[1].end is not None
        )
        with service.pool.store.session() as s:
            assert s.get(PodSpanRow, first["metadata"]["uid"]).exact  # not "closed when last seen"
        # its project's row (the relist also finds other modules' train pods still on this shared
        # plane: jobs this test's store does not know, counted under project "?")
        rows = {r["key"]: r for r in usage.report(0, seen + 1, "project")["rows"]}
        total = rows["default"]["allocated_milli_s"]
        assert total == sum(500 * (h.end - h.start) for h in spans if h.end is not None)
    finally:
        await service.stop()


async def test_notebook_output_is_kept_beside_the_checkpoints_and_cancel_removes_everything(
    hub_api, admin: Resources, tmp_path: Path
) -> None:
    service = make_service(tmp_path, hub_api)
    await service.start()
    try:
        row = await service.submit(
            JobRequest(
                owner="bob",
                project="default",
                name="nb",
                num_gpu=1,
                gpu_milli=1000,
                code=JobCode.notebook(b"{}"),
            )
        )
        volume_for(admin, row.id)
        job = admin.get(f"{JOBS}/{name_of(row.id)}")
        assert job["spec"]["template"]["spec"]["containers"][0]["command"] == [
            "python",
            "-m",
            "gpupool.widgets.execute",
            "input.ipynb",
            "/checkpoint/output.ipynb",
        ]
        await wait_for(lambda: service.job(row.id).state == "running", what="running")
        await service.cancel(row.id)
        await wait_for(lambda: service.job(row.id).state == "cancelled", what="cancelled")
        ns = f"/api/v1/namespaces/{HUB_NS}"
        await wait_for(lambda: admin.get(f"{ns}/configmaps/{code_name(row.id)}") is None, what="code gone")
        await wait_for(lambda: not pods_of(admin, row.id), what="pods gone")
        assert admin.get(f"{JOBS}/{name_of(row.id)}") is None
    finally:
        await service.stop()


async def test_a_job_the_cluster_could_not_take_is_sent_once_after_a_hub_restart(
    hub_api, plane: ControlPlane, admin: Resources, tmp_path: Path
) -> None:
    # the API server cannot be reached when the job is submitted: the row waits, nothing is lost
    async with client.ApiClient(client.Configuration(host="http://127.0.0.1:9")) as dead:
        down = make_service(tmp_path, dead)
        row = await down.submit(
            JobRequest(
                owner="ann",
                project="default",
                name="later",
                num_gpu=1,
                gpu_milli=1000,
                code=JobCode.script(b"print(1)"),
            )
        )
    assert row.state == "queued" and "retrying" in row.message
    # the hub restarts with the cluster back: the job is sent, once, with its code
    up = make_service(tmp_path, hub_api)
    await up.start()
    try:
        assert up.unsent == {row.id}
        assert (await up.tick())["sent"] == [row.id]
        assert (await up.tick())["sent"] == []
        code = admin.get(f"/api/v1/namespaces/{HUB_NS}/configmaps/{code_name(row.id)}")
        assert base64.b64decode(code["binaryData"]["job.py"]) == b"print(1)"
        assert not Path(row.workdir).exists()
        assert jobs_created(plane, row.id) == 1
    finally:
        await up.cancel(row.id)
        await up.stop()


async def test_after_a_restart_running_jobs_are_adopted_and_vanished_ones_fail(
    hub_api, plane: ControlPlane, admin: Resources, tmp_path: Path
) -> None:
    first = make_service(tmp_path, hub_api)
    await first.start()
    keep = await first.submit(
        JobRequest(
            owner="ann",
            project="default",
            name="keep",
            num_gpu=1,
            gpu_milli=1000,
            code=JobCode.command(["python", "-c", "1"]),
        )
    )
    gone = await first.submit(
        JobRequest(
            owner="ann",
            project="default",
            name="gone",
            num_gpu=1,
            gpu_milli=1000,
            code=JobCode.command(["python", "-c", "1"]),
        )
    )
    for row in (keep, gone):
        volume_for(admin, row.id)
    await wait_for(lambda: first.job(keep.id).state == "running", what="running")
    await first.stop()
    # while the hub is down one Job runs on, the other is deleted by hand
    admin.http.delete(
        f"{JOBS}/{name_of(gone.id)}", params={"propagationPolicy": "Background"}
    ).raise_for_status()
    second = make_service(tmp_path, hub_api)
    await second.start()
    try:
        assert second.job(keep.id).state == "running"
        assert second.job(gone.id).state in ("failed", "cancelled")
        assert "outside gpupool" in second.job(gone.id).message or "gone" in second.job(gone.id).message
        assert second.unsent == set()
        assert (jobs_created(plane, keep.id), jobs_created(plane, gone.id)) == (1, 1)  # nothing sent again
    finally:
        await second.cancel(keep.id)
        await second.stop()


PY = ["python", "-c", "1"]


async def test_a_queued_job_over_budget_is_held_without_a_pod_and_a_top_up_releases_it(
    hub_api, admin: Resources, tmp_path: Path
) -> None:
    """cat's running job uses up her GPU-hour budget: it runs on; her queued one is suspended
    (no pod, queued "held: over budget", no preemption) until an admin tops the budget up."""
    from gpupool.usage.service import CACHE_S

    clock = [time.time()]
    service = make_service(tmp_path, hub_api)
    usage = UsageService(service.pool, Usage(budgets={"user:cat": {"gpu_hours": 1}}), clock=lambda: clock[0])
    service.holds = usage.held_jobs  # as the hub wires it (gpupool.wiring.setup)
    await service.start()
    live = lambda job_id: [p for p in pods_of(admin, job_id) if not p["metadata"].get("deletionTimestamp")]  # noqa: E731
    try:
        run = await service.submit(job_request(owner="cat", project="default", name="run", command=PY))
        volume_for(admin, run.id)
        await wait_for(lambda: service.job(run.id).state == "running", what="row running")
        # nine GPUs: more than a node has, so it waits in its queue with a pod
        wait = await service.submit(
            job_request(owner="cat", project="default", name="wait", command=PY, num_gpu=9)
        )
        await wait_for(lambda: live(wait.id), what="the queued job's pod")
        await wait_for(
            lambda: wait.id in service.controller.jobs and service.controller.pods.get(wait.id),
            what="the watch to see its Job and pod",
        )
        assert (await service.tick())["budget_held"] == []  # within budget: nothing held
        # two hours on, the running job's pod seen alive by the relist: 2 of 1 GPU-h used
        clock[0] += 7200
        await service.record_usage(now=clock[0])

        async def dies(job_id: str, hold: bool) -> bool:
            raise ConnectionError("the hub died here")

        # the hub records the hold in the row, then dies before it suspends the Job ...
        service.controller.hold = dies  # type: ignore[method-assign]
        assert (await service.tick())["budget_held"] == [wait.id]
        assert service.job(wait.id).intent == "budget-hold"
        assert not admin.get(f"{JOBS}/{name_of(wait.id)}")["spec"].get("suspend")
        await service.stop()
        # ... and the next hub finishes it
        service = make_service(tmp_path, hub_api)
        service.holds = usage.held_jobs
        await service.start()
        done = await service.tick()
        assert (done["budget_held"], done["budget_released"]) == ([wait.id], [])
        assert admin.get(f"{JOBS}/{name_of(wait.id)}")["spec"]["suspend"] is True
        await wait_for(lambda: not live(wait.id), what="the held job's pod removed by the Job controller")
        await wait_for(
            lambda: service.controller.status(wait.id).message.startswith("held"), what="seen held"
        )
        held = service.job(wait.id)
        assert (held.state, held.preemptions) == ("queued", 0)
        assert held.message.startswith("held: over budget")
        assert usage.held_jobs([held])[wait.id].startswith(
            "held: cat's GPU-hour budget"
        )  # the API's wait_reason
        # a budget never stops running work
        assert service.job(run.id).state == "running" and running_pod(admin, run.id, set())
        assert not admin.get(f"{JOBS}/{name_of(run.id)}")["spec"].get("suspend")
        assert (await service.tick())["budget_held"] == []  # held once, not patched again
        kinds = [e.kind for e in service.pool.store.events(name=wait.id)]
        assert "budget-hold" in kinds and "preempt" not in kinds
        # an admin tops cat's budget up: once the budget states are read again, the Job resumes
        usage.ledger.add_grant("user:cat", "topup", 5 * 3600 * 1000, int(clock[0]) + 86400, by="root")
        clock[0] += CACHE_S
        done = await service.tick()
        assert (done["budget_held"], done["budget_released"]) == ([], [wait.id])
        assert service.job(wait.id).intent == ""
        assert admin.get(f"{JOBS}/{name_of(wait.id)}")["spec"]["suspend"] is False
        await wait_for(lambda: live(wait.id), what="a pod again, waiting for GPUs")
        await wait_for(
            lambda: service.job(wait.id).message.startswith("waiting for GPUs"), what="waiting again"
        )
        assert service.job(wait.id).state == "queued" and service.job(wait.id).preemptions == 0
        assert "budget-release" in [e.kind for e in service.pool.store.events(name=wait.id)]
    finally:
        for row in service.jobs():
            if row.state not in ("succeeded", "failed", "cancelled"):
                await service.cancel(row.id)
        await service.stop()


async def test_a_job_the_api_server_refuses_fails_with_its_reason(hub_api, tmp_path: Path) -> None:
    """An admin's typo the real API server refuses (backoffLimit must be an integer)."""
    svc = make_service(tmp_path, hub_api, backoff_limit="many")
    row = await svc.submit(
        JobRequest(
            owner="ann",
            project="default",
            name="typo",
            num_gpu=1,
            gpu_milli=1000,
            code=JobCode.command(["python", "-c", "1"]),
        )
    )
    assert row.state == "failed" and row.message.startswith("Kubernetes refused the Job (4"), row.message
    assert "backoffLimit" in row.message or "many" in row.message, row.message
    assert svc.unsent == set() and (await svc.tick())["sent"] == []  # not retried


# --- the same through a real hub's jobs API ------------------------------------------------
@pytest.mark.hub
def test_a_hub_in_kubernetes_mode_runs_jobs_as_jobs(
    make_hub, plane: ControlPlane, chart, admin: Resources, tmp_path: Path
) -> None:
    kubeconfig = plane.sa_kubeconfig(tmp_path / "hub.kubeconfig", HUB_NS, "hub")
    hub = make_hub(
        f"""
        c.TrainPool.runner = "kubernetes"
        c.TrainPool.image = "registry.example.org/train:1"
        c.TrainPool.tick_s = 0.3
        c.TrainPool.projects = {{"vision": {{"guarantee": 1}}}}
        c.TrainPool.kube_job_options = {{"namespace": "{HUB_NS}", "storage_class": "{STORAGE}",
                                         "checkpoint_size": "1Gi"}}
    """,
        env={"KUBECONFIG": str(kubeconfig), "GPUPOOL_CULLER": "0"},
    ).start()
    J = "/services/gpupool/api/jobs"
    token = hub.user_token("ann")
    code, message = hub.api_error("POST", J, {"project": "nope", "gpus": 1, "command": "true"}, token=token)
    assert code == 400 and "unknown project" in message
    job = hub.api(
        "POST",
        J,
        {"project": "vision", "gpus": 0.5, "name": "train", "script": "print('hello from the pod')"},
        token=token,
    )
    assert job["state"] == "queued"
    assert admin.get(f"{JOBS}/{name_of(job['id'])}") is not None
    volume_for(admin, job["id"])

    def state() -> dict:
        return hub.api("GET", f"{J}/{job['id']}", token=token)

    until(lambda: state()["state"] == "running", "the job running", timeout=60, every=0.3, detail=hub.tail)
    code, _ = hub.api_error("DELETE", f"{J}/{job['id']}", token=hub.user_token("bob"))
    assert code == 404 and admin.get(f"{JOBS}/{name_of(job['id'])}") is not None  # not bob's to cancel
    hub.api("DELETE", f"{J}/{job['id']}", token=token)
    until(
        lambda: state()["state"] == "cancelled",
        "the job cancelled",
        timeout=90,  # the old bound at most: 30 s after the first wait's 60 s
        every=0.3,
        detail=hub.tail,
    )
    assert admin.get(f"{JOBS}/{name_of(job['id'])}") is None


async def test_a_jobs_log_is_kept_by_the_hub_after_its_pod_is_gone(
    hub_api, plane: ControlPlane, admin: Resources, tmp_path: Path
) -> None:
    """The real API server's `pods/log?follow=true`, proxied to the pod's node (kwok serves it as
    a kubelet does): the hub copies the running pod's output as it comes into the job's kept
    log, which the job's page still shows once the Job and its pods are gone."""
    service = make_service(tmp_path, hub_api)
    await service.start()
    assert service.kept is not None
    kept_logs = service.kept
    kept_logs.gone_grace_s = 1.0  # kwok's streams never end: dropped this long after the pod went
    kept_logs.retry_s = 0.2  # a pod's node may answer 500 for a moment after it runs: read again soon
    try:
        row = await service.submit(
            job_request(owner="ann", project="default", name="logged", command=["true"], gpu_milli=500)
        )
        volume_for(admin, row.id)
        await wait_for(lambda: running_pod(admin, row.id, set()), what="the pod to run")
        await wait_for(lambda: service.job(row.id).state == "running", what="row running")
        plane.write_pod_log(f"{row.id} epoch 1\n{row.id} epoch 2\n")
        kept = tmp_path / "train-logs" / f"{row.id}.log"
        await wait_for(
            lambda: kept.exists() and f"{row.id} epoch 2\n" in kept.read_text(), what="the output kept"
        )
        await service.cancel(row.id)
        await wait_for(lambda: not pods_of(admin, row.id), what="its pods gone")
        await wait_for(lambda: not kept_logs.tasks, what="its log no longer followed")
        lines = (await service.logs(service.job(row.id), 100))["lines"]
        assert f"{row.id} epoch 1" in lines and lines[-1] == f"{row.id} epoch 2"
    finally:
        await service.stop()
