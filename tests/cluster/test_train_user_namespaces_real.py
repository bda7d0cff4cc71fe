"""User namespaces for train Jobs on the real control plane, as the chart's hub account with the
chart's config, ClusterRole and admission policy: a user's `%%train` Job goes to the namespace
kubespawner gives their workspace (made by the hub, with the chart's Pod Security level, when no
workspace made it yet), fenced there like the workspace (the train pods' NetworkPolicy, the
other user's RBAC), and the hub follows it to its end, holds and cancels it, and counts its pod's
GPU-hours there. Before, every user's Job ran in the hub's namespace beside everyone else's.

Simulated as in test_train_jobs_real.py: the container's exit (a kwok stage)."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

from kubespawner.slugs import safe_slug
from traitlets.config import Config

from gpupool.kube.job_namespace import owner_namespace
from gpupool.kube.objects import code_name, name_of
from gpupool.train.code import JobCode
from gpupool.train.config import TrainPool
from gpupool.train.request import JobRequest
from gpupool.usage.config import Usage
from gpupool.usage.service import UsageService
from tests.cluster.conftest import HUB_NS
from tests.cluster.netpol import Pod, allowed
from tests.cluster.plane import EXIT_CODE, ControlPlane
from tests.cluster.resources import Resources
from tests.cluster.test_chart_real import as_user
from tests.cluster.test_train_jobs_real import (
    hub_api,  # noqa: F401 - the fixture
    make_service,
    volume_for,
    wait_for,
)

OWNER = "Grace.Hopper@Uni"  # in no list of the chart's, and no DNS label


def running_pod(admin: Resources, ns: str, job_id: str) -> dict | None:
    pods = admin.get(f"/api/v1/namespaces/{ns}/pods?labelSelector=gpupool.io/job-id={job_id}")["items"]
    return next((p for p in pods if p["status"].get("phase") == "Running"), None)


async def test_a_users_job_runs_in_their_own_namespace_fenced_and_followed_to_its_end(
    hub_api, plane: ControlPlane, chart: list[dict], admin: Resources, tmp_path: Path
) -> None:
    cm = next(d for d in chart if d["kind"] == "ConfigMap" and d["metadata"]["name"] == "gpupool-config")
    ours = json.loads(cm["data"]["hub-config.json"])
    service = make_service(
        tmp_path,
        hub_api,
        spawner=ours["KubeSpawner"],  # the chart's user namespaces: enable_user_namespaces, template
        network_policy=ours["TrainPool"]["kube_job_options"]["network_policy"],
    )
    ns = owner_namespace(OWNER, HUB_NS, ours["KubeSpawner"]["user_namespace_template"])
    assert ns.startswith("gpupool-grace-hopper-uni")
    await service.start()
    try:
        row = await service.submit(
            JobRequest(
                owner=OWNER,
                project="default",
                name="resnet",
                num_gpu=1,
                gpu_milli=1000,
                code=JobCode.script(b"print('epoch 1')\n"),
            )
        )
        volume_for(admin, row.id)
        # the Job, its claim and its code in the owner's namespace, none in the hub's
        assert admin.get(f"/apis/batch/v1/namespaces/{ns}/jobs/{name_of(row.id)}") is not None
        assert admin.get(f"/apis/batch/v1/namespaces/{HUB_NS}/jobs/{name_of(row.id)}") is None
        assert admin.get(f"/api/v1/namespaces/{ns}/persistentvolumeclaims/gpupool-ckpt-{row.id}") is not None
        assert admin.get(f"/api/v1/namespaces/{ns}/configmaps/{code_name(row.id)}") is not None
        # the namespace as kubespawner would have made it: Pod Security enforced, gpupool.io/user
        labels = admin.get(f"/api/v1/namespaces/{ns}")["metadata"]["labels"]
        assert labels["pod-security.kubernetes.io/enforce"] == "restricted"
        assert labels["gpupool.io/user"] == ns.removeprefix("gpupool-")

        pod = await wait_for(
            lambda: running_pod(admin, ns, row.id), what="the pod to run in the user's namespace"
        )
        await wait_for(lambda: service.job(row.id).state == "running", what="row running")
        await service.record_usage()  # its GPU-hours: the train pods' list finds it there
        held = UsageService(service.pool, Usage()).ledger.held(0, 2**31)
        assert [(h.kind, h.milli) for h in held if h.name == row.id] == [("train", 1000)]

        # fenced: the train pods' policy (as the API server admitted it) lets it out to the
        # gpupool API and the internet, never to another user's namespace, the metadata
        # server or a private address, and nothing outside its namespace in
        policy = admin.get(f"/apis/networking.k8s.io/v1/namespaces/{ns}/networkpolicies/gpupool-train")
        train = Pod(ns, pod["metadata"]["labels"])
        other_job = Pod("gpupool-ann", pod["metadata"]["labels"])  # another user's train pod
        workspace = Pod("gpupool-ann", {"component": "singleuser-server"}, {"notebook-port": 8888})
        hub = Pod(HUB_NS, {"component": "hub"})
        ns_labels = {
            n: admin.get(f"/api/v1/namespaces/{n}")["metadata"]["labels"] for n in (ns, HUB_NS, "gpupool-ann")
        }

        def check(a, b, port: int) -> bool:
            return allowed([policy], ns_labels, a, b, port)

        assert check(train, hub, 8095) and check(train, "151.101.0.223", 443)
        assert not check(train, workspace, 8888) and not check(train, "169.254.169.254", 80)
        assert not check(train, "10.1.2.3", 443) and not check(other_job, train, 29500)
        with as_user(plane, "ann") as ann:  # another user reads nothing of it
            assert ann.get(f"/api/v1/namespaces/{ns}/pods").status_code == 403
            assert ann.get(f"/api/v1/namespaces/{ns}/pods/{pod['metadata']['name']}/log").status_code == 403

        # followed to its end there
        r = admin.http.patch(
            f"/api/v1/namespaces/{ns}/pods/{pod['metadata']['name']}",
            json={"metadata": {"annotations": {EXIT_CODE: "0"}}},
            headers={"Content-Type": "application/merge-patch+json"},
        )
        r.raise_for_status()
        await wait_for(lambda: service.job(row.id).state == "succeeded", what="succeeded")

        # the owner's home in their next job: the admin turns the home mount on (z2jh's dynamic
        # storage) and the user's server made its claim (kubespawner, at a spawn; here a
        # ReadWriteMany one, so the job may run on any node)
        home = Config()
        home.KubeSpawner.volumes = {"v": {"name": "v", "persistentVolumeClaim": {"claimName": "{pvc_name}"}}}
        home.KubeSpawner.volume_mounts = {"v": {"name": "v", "mountPath": "/home/jovyan"}}
        home.TrainPool.home_mount = "read-only"
        service.opts = service.controller.opts = replace(
            service.opts, **TrainPool(config=home).home_options()
        )
        user_claim = f"claim-{safe_slug(OWNER)}"  # kubespawner's claim-{user_server}
        admin.apply(
            {
                "apiVersion": "v1",
                "kind": "PersistentVolumeClaim",
                "metadata": {"name": user_claim, "namespace": ns},
                "spec": {"accessModes": ["ReadWriteMany"], "resources": {"requests": {"storage": "1Gi"}}},
            }
        )

        # a second one (its claims never bind: it waits) is held for a budget and cancelled there
        second = await service.submit(
            JobRequest(
                owner=OWNER,
                project="default",
                name="held",
                num_gpu=1,
                gpu_milli=1000,
                code=JobCode.command(["python", "train.py"]),
            )
        )
        await wait_for(lambda: second.id in service.controller.jobs, what="the second Job followed")
        # its pod, as the Job controller made it in the user's namespace, mounts the user's claim
        made = await wait_for(
            lambda: next(
                iter(
                    admin.get(f"/api/v1/namespaces/{ns}/pods?labelSelector=gpupool.io/job-id={second.id}")[
                        "items"
                    ]
                ),
                None,
            ),
            what="the second Job's pod",
        )
        assert {"name": "home", "persistentVolumeClaim": {"claimName": user_claim, "readOnly": True}} in made[
            "spec"
        ]["volumes"]
        assert await service.controller.hold(second.id, True)
        job = admin.get(f"/apis/batch/v1/namespaces/{ns}/jobs/{name_of(second.id)}")
        assert job["spec"]["suspend"] is True
        await service.cancel(second.id)
        await wait_for(lambda: service.job(second.id).state == "cancelled", what="cancelled")
        await wait_for(
            lambda: admin.get(f"/apis/batch/v1/namespaces/{ns}/jobs/{name_of(second.id)}") is None,
            what="the cancelled Job deleted",
        )
    finally:
        await service.stop()
        admin.http.delete(f"/api/v1/namespaces/{ns}")
        for pv in admin.get("/api/v1/persistentvolumes")["items"]:
            if ((pv["spec"].get("claimRef") or {}).get("namespace")) == ns:
                admin.http.delete(f"/api/v1/persistentvolumes/{pv['metadata']['name']}")
