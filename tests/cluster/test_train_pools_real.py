"""Train jobs on node pools through the hub on a real API server: the REST API takes pools and
elastic jobs and the Jobs as admitted carry KAI's mapping (one shard per job); an idle job is
stopped from the node agents' samples. Where the pods land is KAI's real schedulers' business
(one per shard): tests/cluster/test_kai_real.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.cluster.conftest import HUB_NS
from tests.cluster.resources import Resources
from tests.cluster.test_train_jobs_real import STORAGE, hub_api  # noqa: F401 (a fixture)
from tests.support.wait import until_async

WS_NODE = "ws-node-0"


def volume(admin: Resources, name: str, mode: str) -> None:
    """A PV a job's checkpoint claim binds to (what a provisioner would make)."""
    admin.apply(
        {
            "apiVersion": "v1",
            "kind": "PersistentVolume",
            "metadata": {"name": f"pv-{name}"},
            "spec": {
                "capacity": {"storage": "1Gi"},
                "accessModes": [mode],
                "storageClassName": STORAGE,
                "hostPath": {"path": f"/tmp/gpupool-test/{name}"},
                "persistentVolumeReclaimPolicy": "Delete",
            },
        }
    )


def service(tmp_path: Path, api, projects: dict | None = None):
    from traitlets.config import Config

    from gpupool.alloc.manager import PoolManager
    from gpupool.gpu.sharing import KAISharing
    from gpupool.pool import BuildLimits, BuildQuotaPolicy, get_policy, virtual_inventory
    from gpupool.store import Store
    from gpupool.train.config import TrainPool
    from gpupool.train.kube_service import KubeTrainingService

    c = Config()
    c.TrainPool.node_pools = {"dgx": {"models": ["NVIDIA H100 80GB HBM3"]}, "ws": {"nodes": [WS_NODE]}}
    c.TrainPool.projects = projects or {
        "vision": {"guarantee": {"dgx": 2, "ws": 1}, "limit": 6},
        "lab": {"guarantee": 1, "pools": ["ws"]},
    }
    c.TrainPool.runner = "kubernetes"
    c.TrainPool.image = "registry.example.org/train:1"
    c.TrainPool.jobs_root = str(tmp_path / "jobs" / "{username}")
    c.TrainPool.kube_logs_dir = str(tmp_path / "train-logs")  # not the default, relative to the cwd
    c.TrainPool.kube_job_options = {"namespace": HUB_NS, "storage_class": STORAGE, "checkpoint_size": "1Gi"}
    pool = PoolManager(
        virtual_inventory(4),
        Store(f"sqlite:///{tmp_path}/pool.sqlite"),
        BuildQuotaPolicy(BuildLimits(1000, (250, 1000), 1000, 2)),
        get_policy("best-fit"),
    )
    return KubeTrainingService(pool, TrainPool(config=c), api, KAISharing())


async def test_an_idle_job_is_warned_then_stopped_from_the_node_agents_samples(
    hub_api, admin: Resources, tmp_path: Path
) -> None:
    """The embedded idle rule on Kubernetes: the running pod's sample (keyed by its uid, as the
    node agent reports pods; here the file sampler stands in for the agents) stays at 0 %;
    the job is warned, then its Job is deleted and the job ends failed, "idle GPU"."""
    import json
    import time

    from gpupool.idle_culler.sampler import FileSampler
    from gpupool.wiring.setup import kube_job_gpu_use

    svc = service(tmp_path, hub_api, {"lab": {"guarantee": 1, "idle_gpu_s": 600}})
    samples = tmp_path / "samples.json"
    svc.gpu_use = kube_job_gpu_use(FileSampler(str(samples)))
    await svc.start()
    try:
        from gpupool.train.code import JobCode
        from gpupool.train.request import JobRequest

        row = await svc.submit(
            JobRequest(
                owner="ann",
                project="lab",
                name="hung",
                num_gpu=1,
                gpu_milli=1000,
                code=JobCode.command(["python", "train.py"]),
            )
        )
        volume(admin, f"gpupool-ckpt-{row.id}", "ReadWriteOnce")
        await until_async(
            lambda: svc.job(row.id).state == "running" and svc.running_pods(row.id),
            "the job running in a pod",
            timeout=60,
            every=0.2,
            detail=lambda: svc.job(row.id).to_json(),
        )
        uid = svc.running_pods(row.id)[0]
        samples.write_text(json.dumps({f"ann/{row.id}/{uid}": {"util_pct": 0}}))
        t0 = time.time()
        assert (await svc.tick(now=t0))["idle_stopped"] == []
        await svc.tick(now=t0 + 301)
        assert svc.job(row.id).message.startswith("warning: its GPUs have been idle for 5 min")
        samples.write_text(
            json.dumps({f"ann/{row.id}/{uid}": {"util_pct": 40}})
        )  # busy: the clock starts over
        await svc.tick(now=t0 + 400)
        samples.write_text(json.dumps({f"ann/{row.id}/{uid}": {"util_pct": 0.5}}))
        await svc.tick(now=t0 + 500)
        assert (await svc.tick(now=t0 + 1050))["idle_stopped"] == []  # idle 550 s only
        assert (await svc.tick(now=t0 + 1101))["idle_stopped"] == [row.id]
        await until_async(
            lambda: svc.job(row.id).state == "failed",
            "the idle job failed",
            timeout=120,  # the old bound at most: 60 s after the first wait's 60 s
            every=0.2,
            detail=lambda: svc.job(row.id).to_json(),
        )
        assert svc.job(row.id).message == "idle GPU"
        assert admin.get(
            f"/apis/batch/v1/namespaces/{HUB_NS}/jobs/gpupool-train-{row.id}"
        ) is None or admin.get(f"/apis/batch/v1/namespaces/{HUB_NS}/jobs/gpupool-train-{row.id}")[
            "metadata"
        ].get("deletionTimestamp")
    finally:
        await svc.stop()


@pytest.mark.hub
def test_a_hub_in_kubernetes_mode_takes_pools_and_elastic_jobs(
    make_hub, plane, chart, admin: Resources, tmp_path: Path
) -> None:
    """Through the REST API of a real hub whose Kubernetes calls go to the real API server as the
    chart's hub account: pools and min_gpus are taken, the Jobs as admitted carry the mapping,
    and a job whose pools have no queue for its project is refused (400). With KAI a job goes to
    ONE pool, its shard (the first it chose here): its label, its project's queue there and
    that pool's node affinity. The KAI this hub is told of (kai_version) can gang elastic jobs."""
    from gpupool.kube.objects import name_of

    ns = HUB_NS
    kubeconfig = plane.sa_kubeconfig(tmp_path / "hub.kubeconfig", HUB_NS, "hub")
    jobs = f"/apis/batch/v1/namespaces/{ns}/jobs"
    hub = make_hub(
        f"""
        c.TrainPool.runner = "kubernetes"
        c.TrainPool.image = "registry.example.org/train:1"
        c.TrainPool.node_pools = {{"dgx": {{"models": ["NVIDIA H100 80GB HBM3"]}}, "ws": {{}}, "cloud": {{}}}}
        c.TrainPool.projects = {{"vision": {{"guarantee": {{"dgx": 4, "ws": 2}}, "pools": ["dgx", "ws", "cloud"]}},
                                 "lab": {{"guarantee": 1}}}}
        c.TrainPool.kube_job_options = {{"namespace": "{ns}", "storage_class": "{STORAGE}", "checkpoint_size": "1Gi",
                                        "kai_version": "v0.17.0"}}
    """,
        env={"KUBECONFIG": str(kubeconfig), "GPUPOOL_CULLER": "0"},
    ).start()
    J = "/services/gpupool/api/jobs"
    token = hub.user_token("ann")
    elastic = hub.api(
        "POST",
        J,
        {"project": "lab", "gpus": 4, "min_gpus": 2, "pools": ["ws", "dgx"], "command": "python train.py"},
        token=token,
    )
    job = admin.get(f"{jobs}/{name_of(elastic['id'])}")
    assert (
        job["spec"]["parallelism"] == 4
        and job["metadata"]["annotations"]["kai.scheduler/batch-min-member"] == "2"
    )
    assert job["metadata"]["labels"]["kai.scheduler/node-pool"] == "ws"  # KAI's pod grouper copies it
    template = job["spec"]["template"]
    assert template["metadata"]["labels"]["kai.scheduler/queue"] == "lab-ws"
    terms = template["spec"]["affinity"]["nodeAffinity"]
    assert [
        t["matchExpressions"][0]["values"]
        for t in terms["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    ] == [["ws"]]
    per_pool = hub.api(
        "POST", J, {"project": "vision", "gpus": 2, "pools": ["ws", "dgx"], "command": "true"}, token=token
    )
    labels = admin.get(f"{jobs}/{name_of(per_pool['id'])}")["spec"]["template"]["metadata"]["labels"]
    assert labels["kai.scheduler/queue"] == "vision-ws" and labels["kai.scheduler/node-pool"] == "ws"
    code, message = hub.api_error(
        "POST", J, {"project": "vision", "gpus": 1, "pools": ["cloud"], "command": "true"}, token=token
    )
    assert code == 400 and "has a guarantee only in ['dgx', 'ws']" in message
    for made in (elastic, per_pool):  # pods that wait for pools these kwok nodes lack: not kept
        admin.http.delete(f"{jobs}/{name_of(made['id'])}", params={"propagationPolicy": "Background"})
