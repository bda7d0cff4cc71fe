"""What a GPU share adds to a workspace pod, per backend; the final manifest is validated
strictly and checked against the quota."""

from __future__ import annotations

import kubernetes_validate
import pytest
from tornado import web

from hub_ext.pool import InvalidRequest
from spawner.kube import GPUKubeSpawner
from spawner.kube_objects import pod_gpu, requested_milli

K8S = kubernetes_validate.latest_version()


def pod(patch) -> dict:
    spec = {"containers": [{"name": "notebook", "image": "quay.io/jupyter/base-notebook",
                            "resources": {"limits": dict(patch.limits)}}],
            "priorityClassName": patch.priority_class}
    if patch.scheduler_name:
        spec["schedulerName"] = patch.scheduler_name
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "jupyter-ann", "labels": dict(patch.labels), "annotations": dict(patch.annotations)},
            "spec": spec}


@pytest.mark.parametrize(
    "backend, milli, expect",
    [
        ("kai", 250, {"annotations": {"gpu-fraction": "0.25"}, "labels": {"kai.scheduler/queue": "students"},
                      "schedulerName": "kai-scheduler"}),
        ("kai", 2000, {"limits": {"nvidia.com/gpu": "2"}}),
        ("hami", 500, {"limits": {"nvidia.com/gpu": "1", "nvidia.com/gpucores": "50", "nvidia.com/gpumem": "40000"}}),
        ("mig", 250, {"limits": {"nvidia.com/mig-2g.20gb": "1"}}),
        ("whole", 1000, {"limits": {"nvidia.com/gpu": "1"}}),
    ],
)
def test_each_backend_gives_a_valid_pod_that_asks_for_exactly_the_share(backend, milli, expect) -> None:
    patch = pod_gpu(backend, milli, memory_mib=40000, queue="students")
    manifest = pod(patch)
    kubernetes_validate.validate(manifest, K8S, strict=True)
    limits = manifest["spec"]["containers"][0]["resources"]["limits"]
    for key, value in expect.get("limits", {}).items():
        assert limits[key] == value
    for key, value in expect.get("annotations", {}).items():
        assert manifest["metadata"]["annotations"][key] == value
    for key, value in expect.get("labels", {}).items():
        assert manifest["metadata"]["labels"][key] == value
    if "schedulerName" in expect:
        assert manifest["spec"]["schedulerName"] == expect["schedulerName"]
    assert manifest["spec"]["priorityClassName"] == "build"
    assert requested_milli(manifest) == milli


def test_kai_by_memory() -> None:
    patch = pod_gpu("kai", 500, memory_mib=40000, fraction_by_memory=True)
    assert patch.annotations == {"gpu-memory": "40000"}


@pytest.mark.parametrize("backend, milli, message", [
    ("whole", 250, "whole GPUs only"),
    ("mig", 300, "no MIG profile stands for 0.3 GPU"),
    ("kai", 1500, "neither a fraction"),
    ("slurm", 1000, "unknown GPU sharing backend"),
])
def test_impossible_shares_are_refused(backend, milli, message) -> None:
    with pytest.raises(InvalidRequest, match=message):
        pod_gpu(backend, milli)


def test_a_final_manifest_asking_more_than_the_quota_is_refused() -> None:
    manifest = pod(pod_gpu("kai", 250, queue="q"))
    manifest["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] = "2"  # a profile's doing
    spawner = GPUKubeSpawner.__new__(GPUKubeSpawner)
    with pytest.raises(web.HTTPError) as err:
        GPUKubeSpawner.enforce_quota(spawner, manifest, reserved_milli=250)
    assert err.value.status_code == 403 and "asks for 2.25 GPU but your quota allowed 0.25" in err.value.log_message
