"""The training pool's Kubernetes back-end: jobs submitted through the hub's service become
Jobs on the (fake) API server, and the job rows follow what the watch sees; after a hub restart
nothing is lost and nothing runs twice."""

from __future__ import annotations

import base64
from pathlib import Path

import pytest
from gpupool.gpu.sharing import KAISharing
from gpupool.kube.objects import code_name, name_of
from gpupool.manager import PoolManager
from gpupool.pool import BuildLimits, BuildQuotaPolicy, get_policy, virtual_inventory
from gpupool.store import Store
from gpupool.train.config import TrainPool
from gpupool.train.kube_service import KubeTrainingService
from kubernetes_asyncio import client
from traitlets.config import Config

from tests.k8s.conftest import until
from tests.k8s.fake_apiserver import Cluster, FakeAPIServer

NS = "jhub"


def make_service(tmp_path: Path, api_client, **train) -> KubeTrainingService:
    c = Config()
    c.TrainPool.projects = {"vision": {"guarantee": 1}}
    c.TrainPool.runner = "kubernetes"
    c.TrainPool.image = "registry.example.org/train:1"
    c.TrainPool.jobs_root = str(tmp_path / "jobs" / "{username}")
    c.TrainPool.kube_job_options = {"namespace": NS, "device_memory_mib": 81920}
    for k, v in train.items():
        setattr(c.TrainPool, k, v)
    pool = PoolManager(virtual_inventory(4), Store(f"sqlite:///{tmp_path}/pool.sqlite"),
                       BuildQuotaPolicy(BuildLimits(1000, (250, 1000), 1000, 2)), get_policy("best-fit"))
    svc = KubeTrainingService(pool, TrainPool(config=c), api_client, KAISharing())
    svc.controller.watch_timeout_s = 2
    return svc


@pytest.fixture
async def service(tmp_path: Path, api_client):
    svc = make_service(tmp_path, api_client)
    await svc.start()
    yield svc
    await svc.stop()


def only_pod(cluster: Cluster, job_id: str) -> str:
    pods = [p for p in cluster.pods(NS, f"batch.kubernetes.io/job-name={name_of(job_id)}")]
    return pods[-1]["metadata"]["name"]


async def test_a_script_job_becomes_a_job_with_its_code_and_its_row_follows_the_cluster(
        service: KubeTrainingService, cluster: Cluster, apiserver: FakeAPIServer) -> None:
    row = await service.submit("ann", "vision", "resnet", 1, 500, [__import__("sys").executable, "job.py"],
                               files={"job.py": b"print('epoch 1')\n"})
    assert row.state == "queued" and "waiting for GPUs in queue vision" in row.message
    job = cluster.job(NS, name_of(row.id))
    pod = job["spec"]["template"]["spec"]
    container = pod["containers"][0]
    assert container["command"] == ["python", "job.py"]  # the image's python, not the hub's
    assert job["spec"]["template"]["metadata"]["annotations"]["gpu-fraction"] == "0.5"
    assert container["workingDir"] == "/gpupool/job"
    assert {"name": "code", "mountPath": "/gpupool/job/job.py", "subPath": "job.py", "readOnly": True} \
        in container["volumeMounts"]
    code = apiserver.get("api/v1", "configmaps", NS, code_name(row.id))
    assert base64.b64decode(code["binaryData"]["job.py"]) == b"print('epoch 1')\n"
    assert code["metadata"]["ownerReferences"][0]["uid"] == job["metadata"]["uid"]  # deleted with its Job
    assert not Path(row.workdir).exists()  # the cluster holds the code now: nothing left on the hub's volume

    first = cluster.start_job_pod(NS, name_of(row.id))["metadata"]["name"]
    cluster.run_pod(NS, first)
    await until(lambda: service.job(row.id).state == "running", what="running")
    assert service.job(row.id).started is not None
    cluster.api.write_log(NS, first, "".join(f"step {i}\n" for i in range(300)))
    logs = await service.logs(service.job(row.id), 5)
    assert logs["lines"] == [f"step {i}" for i in range(295, 300)]

    cluster.evict_pod(NS, first)  # KAI reclaims the GPUs for another queue's guarantee
    await until(lambda: service.job(row.id).state == "queued", what="requeued after preemption")
    got = service.job(row.id)
    assert got.preemptions == 1 and "checkpoint" in got.message
    second = cluster.start_job_pod(NS, name_of(row.id))["metadata"]["name"]
    cluster.run_pod(NS, second)
    await until(lambda: service.job(row.id).state == "running", what="resumed")
    assert (service.job(row.id).runs, service.job(row.id).message) == (2, "resumed from its checkpoint")
    cluster.finish_job(NS, name_of(row.id), succeeded=True)
    await until(lambda: service.job(row.id).state == "succeeded", what="succeeded")
    assert service.job(row.id).finished is not None
    kinds = [e.kind for e in reversed(service.pool.store.events(name=row.id))]
    assert kinds == ["job", "start", "preempt", "resume", "job"]


async def test_notebook_output_is_kept_beside_the_checkpoints(service: KubeTrainingService,
                                                             cluster: Cluster) -> None:
    import sys

    row = await service.submit("ann", "vision", "nb", 1, 1000,
                               [sys.executable, "-m", "gpupool.widgets.execute", "input.ipynb", "output.ipynb"],
                               files={"input.ipynb": b"{}"})
    command = cluster.job(NS, name_of(row.id))["spec"]["template"]["spec"]["containers"][0]["command"]
    assert command == ["python", "-m", "gpupool.widgets.execute", "input.ipynb", "/checkpoint/output.ipynb"]


async def test_cancel_deletes_the_job_its_pods_and_its_code(service: KubeTrainingService, cluster: Cluster,
                                                             apiserver: FakeAPIServer) -> None:
    row = await service.submit("bob", "vision", "long", 1, 1000, ["sleep", "1000"], files={"a.txt": b"x"})
    pod = cluster.start_job_pod(NS, name_of(row.id))["metadata"]["name"]
    cluster.run_pod(NS, pod)
    await until(lambda: service.job(row.id).state == "running", what="running")
    await service.cancel(row.id)
    await until(lambda: service.job(row.id).state == "cancelled", what="cancelled")
    assert cluster.job(NS, name_of(row.id)) is None and cluster.pods(NS) == []
    assert apiserver.get("api/v1", "configmaps", NS, code_name(row.id)) is None
    assert apiserver.list("api/v1", "persistentvolumeclaims", NS) == []  # the checkpoints go with it


async def test_a_job_the_cluster_could_not_take_is_sent_once_after_a_hub_restart(
        tmp_path: Path, api_client, apiserver: FakeAPIServer, cluster: Cluster) -> None:
    # the API server is unreachable when the job is submitted: the row waits, nothing is lost
    async with client.ApiClient(client.Configuration(host="http://127.0.0.1:9")) as dead:
        down = make_service(tmp_path, dead)
        row = await down.submit("ann", "vision", "later", 1, 1000, ["python", "job.py"],
                                files={"job.py": b"print(1)"})
    assert row.state == "queued" and "retrying" in row.message
    # the hub restarts with the cluster back: the job is sent, once, with its code
    up = make_service(tmp_path, api_client)
    await up.start()
    try:
        assert up.unsent == {row.id}
        assert (await up.tick())["sent"] == [row.id]
        await up.tick()
        code = apiserver.get("api/v1", "configmaps", NS, code_name(row.id))
        assert base64.b64decode(code["binaryData"]["job.py"]) == b"print(1)"
        assert not Path(row.workdir).exists()
        creates = [r for r in apiserver.requests() if r[0] == "POST" and r[1].endswith("/jobs")]
        assert len(creates) == 1
        await until(lambda: "waiting for GPUs" in up.job(row.id).message, what="queued on the cluster")
    finally:
        await up.stop()


async def test_after_a_restart_running_jobs_are_adopted_and_vanished_ones_fail(
        tmp_path: Path, api_client, apiserver: FakeAPIServer, cluster: Cluster) -> None:
    first = make_service(tmp_path, api_client)
    await first.start()
    keep = await first.submit("ann", "vision", "keep", 1, 1000, ["python", "-c", "1"])
    gone = await first.submit("ann", "vision", "gone", 1, 1000, ["python", "-c", "1"])
    pod = cluster.start_job_pod(NS, name_of(keep.id))["metadata"]["name"]
    cluster.run_pod(NS, pod)
    await until(lambda: first.job(keep.id).state == "running", what="running")
    await first.stop()
    # while the hub is down one Job runs on, the other is deleted by hand
    cluster.api.remove("apis/batch/v1", "jobs", NS, name_of(gone.id))
    second = make_service(tmp_path, api_client)
    await second.start()
    try:
        assert second.job(keep.id).state == "running"
        assert second.job(gone.id).state in ("failed", "cancelled")
        assert "outside gpupool" in second.job(gone.id).message or "gone" in second.job(gone.id).message
        assert second.unsent == set()
        creates = [r for r in apiserver.requests() if r[0] == "POST" and r[1].endswith("/jobs")]
        assert len(creates) == 2  # nothing sent again
    finally:
        await second.stop()


def test_kubernetes_mode_needs_an_image_and_known_job_options(tmp_path: Path) -> None:
    from traitlets import TraitError

    c = Config()
    c.TrainPool.kube_job_options = {"namespace": NS, "colour": "blue"}
    with pytest.raises(TraitError, match="unknown keys \\['colour'\\]"):
        TrainPool(config=c)
    with pytest.raises(ValueError, match="TrainPool.image"):
        make_service(tmp_path, None, image="")


# --- the same through a real hub's jobs API ------------------------------------------------
@pytest.mark.hub
def test_a_hub_in_kubernetes_mode_runs_jobs_as_jobs(make_hub, kubeconfig: Path, cluster: Cluster) -> None:
    import time

    hub = make_hub(f"""
        c.TrainPool.runner = "kubernetes"
        c.TrainPool.image = "registry.example.org/train:1"
        c.TrainPool.tick_s = 0.3
        c.TrainPool.projects = {{"vision": {{"guarantee": 1}}}}
        c.TrainPool.kube_job_options = {{"namespace": "{NS}"}}
    """, env={"KUBECONFIG": str(kubeconfig), "GPUPOOL_CULLER": "0"}).start()
    J = "/services/gpupool/api/jobs"
    token = hub.user_token("ann")
    code, message = hub.api_error("POST", J, {"project": "nope", "gpus": 1, "command": "true"}, token=token)
    assert code == 400 and "unknown project" in message
    job = hub.api("POST", J, {"project": "vision", "gpus": 0.5, "name": "train",
                              "script": "print('hello from the pod')"}, token=token)
    assert job["state"] == "queued"
    assert [j["metadata"]["name"] for j in cluster.api.list("apis/batch/v1", "jobs", NS)] == [name_of(job["id"])]

    def state() -> dict:
        return hub.api("GET", f"{J}/{job['id']}", token=token)

    pod = cluster.start_job_pod(NS, name_of(job["id"]))["metadata"]["name"]
    cluster.run_pod(NS, pod)
    cluster.api.write_log(NS, pod, "hello from the pod\n")
    deadline = time.monotonic() + 20
    while state()["state"] != "running":
        assert time.monotonic() < deadline, hub.tail()
        time.sleep(0.2)
    logs = hub.api("GET", f"{J}/{job['id']}/logs?tail=10", token=token)
    assert logs["lines"] == ["hello from the pod"]
    code, _ = hub.api_error("DELETE", f"{J}/{job['id']}", token=hub.user_token("bob"))
    assert code == 404 and cluster.job(NS, name_of(job["id"])) is not None  # not bob's to cancel
    hub.api("DELETE", f"{J}/{job['id']}", token=token)
    while state()["state"] != "cancelled":
        assert time.monotonic() < deadline + 20, hub.tail()
        time.sleep(0.2)
    assert cluster.job(NS, name_of(job["id"])) is None


async def test_a_job_the_api_server_refuses_fails_with_its_reason(tmp_path: Path, api_client,
                                                                  apiserver: FakeAPIServer) -> None:
    # an admin's typo the API server's validation catches (backoffLimit must be an integer)
    svc = make_service(tmp_path, api_client, kube_job_options={"namespace": NS, "backoff_limit": "many"})
    row = await svc.submit("ann", "vision", "typo", 1, 1000, ["python", "-c", "1"])
    assert row.state == "failed" and row.message.startswith("Kubernetes refused the Job (422)")
    assert "backoffLimit" in row.message or "many" in row.message
    assert svc.unsent == set() and (await svc.tick())["sent"] == []  # not retried
