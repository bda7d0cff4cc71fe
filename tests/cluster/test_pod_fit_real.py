"""Pods that fit a real cluster, on the real control plane with KAI-Scheduler's real components:
the KAI test node is tainted as GKE taints GPU nodes (`nvidia.com/gpu=present:NoSchedule`) and a
namespace enforces the `restricted` Pod Security level. A fractional train Job (created as gpupool
builds it, its pod made by the Job controller) and a fractional workspace (GPUKubeSpawner, as the
hub's account) are admitted by the apiserver's Pod Security admission and placed by KAI's
scheduler onto the tainted node. Before, the train pod was refused (no securityContext) and
neither was ever placed (a fraction asks for no nvidia.com/gpu, so nothing added the toleration).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from types import SimpleNamespace

import pytest

from gpupool.gpu.sharing import KAISharing
from gpupool.kube import TrainJobSpec
from gpupool.kube.objects import JobOptions, train_job
from tests.cluster.conftest import HUB_NS
from tests.cluster.resources import Resources, until
from tests.cluster.test_kai_real import KAI_NODE, kai_plane  # noqa: F401 (a fixture: KAI's processes)
from tests.cluster.test_train_jobs_real import STORAGE

NS = "gpupool-restricted"
TAINT = {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}


def set_taints(admin: Resources, taints: list[dict]) -> None:
    admin.http.patch(
        f"/api/v1/nodes/{KAI_NODE}",
        json={"spec": {"taints": taints}},
        headers={"Content-Type": "application/merge-patch+json"},
    ).raise_for_status()


@pytest.fixture
def restricted(kai_plane: SimpleNamespace, chart: list[dict], admin: Resources) -> Iterator[str]:  # noqa: F811
    """A namespace enforcing `restricted`, where the hub's account may manage pods (z2jh's hub
    Role's rules), with a bound claim for the job's checkpoints; KAI's node tainted meanwhile."""
    admin.apply_all(
        [
            {
                "apiVersion": "v1",
                "kind": "Namespace",
                "metadata": {
                    "name": NS,
                    "labels": {
                        "pod-security.kubernetes.io/enforce": "restricted",
                        "pod-security.kubernetes.io/enforce-version": "latest",
                        # a user namespace: the chart's admission policy lets the hub write here
                        "gpupool.io/user": "ann",
                    },
                },
            },
            {
                "apiVersion": "rbac.authorization.k8s.io/v1",
                "kind": "Role",
                "metadata": {"name": "hub", "namespace": NS},
                "rules": [
                    {
                        "apiGroups": [""],
                        "resources": ["pods"],
                        "verbs": ["get", "watch", "list", "create", "delete"],
                    },
                    {"apiGroups": [""], "resources": ["events"], "verbs": ["get", "watch", "list"]},
                ],
            },
            {
                "apiVersion": "rbac.authorization.k8s.io/v1",
                "kind": "RoleBinding",
                "metadata": {"name": "hub", "namespace": NS},
                "subjects": [{"kind": "ServiceAccount", "name": "hub", "namespace": HUB_NS}],
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "hub"},
            },
            {
                "apiVersion": "v1",
                "kind": "PersistentVolume",
                "metadata": {"name": "pv-fit-ckpt"},
                "spec": {
                    "capacity": {"storage": "1Gi"},
                    "accessModes": ["ReadWriteOnce"],
                    "storageClassName": STORAGE,
                    "hostPath": {"path": "/tmp/gpupool-test/fit-ckpt"},
                    "claimRef": {"namespace": NS, "name": "fit-ckpt"},
                },
            },
            {
                "apiVersion": "v1",
                "kind": "PersistentVolumeClaim",
                "metadata": {"name": "fit-ckpt", "namespace": NS},
                "spec": {
                    "accessModes": ["ReadWriteOnce"],
                    "storageClassName": STORAGE,
                    "resources": {"requests": {"storage": "1Gi"}},
                },
            },
        ]
    )
    set_taints(admin, [TAINT])
    try:
        yield NS
    finally:
        set_taints(admin, [])
        admin.http.delete(f"/api/v1/namespaces/{NS}")
        admin.http.delete("/api/v1/persistentvolumes/pv-fit-ckpt")


def placed(admin: Resources, selector: str) -> dict | None:
    pods = admin.get(f"/api/v1/namespaces/{NS}/pods?labelSelector={selector}")["items"]
    return next(
        (p for p in pods if p["spec"].get("nodeName") and p["status"].get("phase") == "Running"), None
    )


async def test_a_fractional_job_and_workspace_are_admitted_as_restricted_and_placed_on_a_tainted_gpu_node(
    kai_plane: SimpleNamespace,  # noqa: F811
    restricted: str,
    make_spawner,
    admin: Resources,
) -> None:
    # the train Job as the hub's controller creates it (gpupool's default options)
    spec = TrainJobSpec(
        id="fit1", owner="ann", project="default", num_gpu=1, gpu_milli=250, command=["true"], image="x"
    )
    opts = JobOptions(namespace=NS, checkpoint_claim="fit-ckpt")
    admin.apply(train_job(spec, opts, KAISharing()))
    # the workspace, spawned by kubespawner as the hub's account into the restricted namespace
    ws = make_spawner("ann", server="fit", more=lambda c: setattr(c.KubeSpawner, "namespace", NS))
    try:
        await asyncio.wait_for(ws.start(), 90)
        pod = admin.get(f"/api/v1/namespaces/{NS}/pods/{ws.pod_name}")
        assert pod["spec"]["nodeName"] == KAI_NODE and pod["spec"]["schedulerName"] == "kai-scheduler"
        assert pod["metadata"]["annotations"]["gpu-fraction"] == "0.25"
        job_pod = until(
            lambda: placed(admin, "gpupool.io/job-id=fit1"), 60, "KAI to place the job's pod", kai_plane.log
        )
        assert job_pod["spec"]["nodeName"] == KAI_NODE
        assert job_pod["metadata"]["annotations"]["gpu-fraction"] == "0.25"
        qos = job_pod["status"]["qosClass"]
        assert qos == "Burstable", qos  # was BestEffort: resources {}
        assert job_pod["spec"]["automountServiceAccountToken"] is False
        assert not [v for v in job_pod["spec"]["volumes"] if "projected" in v]  # no API token mounted
    finally:
        await ws.stop()
        admin.http.delete(
            f"/apis/batch/v1/namespaces/{NS}/jobs/gpupool-train-fit1",
            params={"propagationPolicy": "Background"},
        )
