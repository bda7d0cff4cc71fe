"""What a GPU share adds to a workspace pod, per sharing backend; reading a final manifest back
counts every way a pod can ask for GPU, so the quota check cannot be side-stepped."""

from __future__ import annotations

import kubernetes_validate
import pytest

from gpupool.gpu.sharing import (
    Claim,
    SharingBackend,
    UnreadableGPU,
    make_backend,
    requested_milli,
    split_milli,
)
from gpupool.pool import BuildLimits, InvalidRequest
from gpupool.spawner.kube_objects import filter_profiles, find_profile, profile_milli

K8S = kubernetes_validate.latest_version()
MEM = 81920  # one device's MiB


def pod(patch, containers: list[dict] | None = None) -> dict:
    spec = {
        "containers": containers
        or [
            {
                "name": "notebook",
                "image": "quay.io/jupyter/base-notebook",
                "resources": {"limits": dict(patch.limits)},
            }
        ],
        "priorityClassName": patch.priority_class,
    }
    if patch.scheduler_name:
        spec["schedulerName"] = patch.scheduler_name
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": "jupyter-ann",
            "labels": dict(patch.labels),
            "annotations": dict(patch.annotations),
        },
        "spec": spec,
    }


@pytest.mark.parametrize(
    "backend, milli, expect",
    [
        (
            "kai",
            250,
            {
                "annotations": {"gpu-fraction": "0.25"},
                "labels": {"kai.scheduler/queue": "students"},
                "schedulerName": "kai-scheduler",
            },
        ),
        ("kai", 2000, {"limits": {"nvidia.com/gpu": "2"}, "labels": {"kai.scheduler/queue": "students"}}),
        (
            "hami",
            500,
            {"limits": {"nvidia.com/gpu": "1", "nvidia.com/gpucores": "50", "nvidia.com/gpumem": "40960"}},
        ),
        ("mig", 250, {"limits": {"nvidia.com/mig-2g.20gb": "1"}}),
        ("whole", 1000, {"limits": {"nvidia.com/gpu": "1"}}),
    ],
)
def test_each_backend_gives_a_valid_pod_that_asks_for_exactly_the_share(backend, milli, expect) -> None:
    patch = make_backend(backend).pod_gpu(*split_milli(milli), memory_mib=MEM, queue="students")
    manifest = pod(patch)
    kubernetes_validate.validate(manifest, K8S, strict=True)
    limits = manifest["spec"]["containers"][0]["resources"]["limits"]
    assert limits == expect.get("limits", {})
    for key, value in expect.get("annotations", {}).items():
        assert manifest["metadata"]["annotations"][key] == value
    for key, value in expect.get("labels", {}).items():
        assert manifest["metadata"]["labels"][key] == value
    if "schedulerName" in expect:
        assert manifest["spec"]["schedulerName"] == expect["schedulerName"]
    assert manifest["spec"]["priorityClassName"] == "build"
    assert requested_milli(manifest, MEM) == milli


def test_kai_by_memory_asks_for_the_share_of_the_device_memory() -> None:
    patch = make_backend("kai", by_memory=True).pod_gpu(1, 500, memory_mib=MEM)
    assert patch.annotations == {"gpu-memory": "40960"}
    assert requested_milli(pod(patch), MEM) == 500


@pytest.mark.parametrize(
    "backend, milli, message",
    [
        ("whole", 250, "whole GPUs only"),
        ("mig", 300, "no MIG profile stands for 0.3 GPU"),
        ("kai", 1500, "neither a fraction"),
        ("slurm", 1000, "unknown GPU sharing backend"),
        ("os.path.join", 1000, "not a gpupool SharingBackend"),
    ],
)
def test_impossible_shares_are_refused(backend, milli, message) -> None:
    with pytest.raises(InvalidRequest, match=message):
        make_backend(backend).pod_gpu(*split_milli(milli))


class TimeSlicing(SharingBackend):
    """A site's own backend: the device plugin's time-slicing, 4 replicas a GPU renamed
    `nvidia.com/gpu.shared`: each replica is a quarter GPU."""

    name = "time-slicing"

    def fraction(self, out, num_gpu, gpu_milli, memory_mib):
        if gpu_milli != 250:
            raise InvalidRequest("time-slicing gives quarters of a GPU")
        out.limits["nvidia.com/gpu.shared"] = str(num_gpu)

    def read_fraction(self, asked, memory_mib):
        if "nvidia.com/gpu.shared" not in asked:
            return Claim()
        return Claim(int(asked["nvidia.com/gpu.shared"]) * 250, frozenset({"nvidia.com/gpu.shared"}))


def test_a_backend_plugged_in_by_import_path_reads_its_own_pods_back() -> None:
    backend = make_backend(f"{__name__}.TimeSlicing")
    assert backend.pod_gpu(1, 250).limits == {"nvidia.com/gpu.shared": "1"}
    assert backend.pod_gpu(2, 1000).limits == {"nvidia.com/gpu": "2"}
    # the quota check reads the site's resource with the site's backend, beside the built-in ones
    shared = pod(
        SharingBackend().pod_gpu(1, 1000),
        [{"name": "c", "resources": {"limits": {"nvidia.com/gpu.shared": "3"}}}],
    )
    assert requested_milli(shared, MEM, backend=backend) == 750
    assert backend.requested_milli(pod(backend.pod_gpu(1, 250))) == 250
    both = {"nvidia.com/gpu.shared": "1", "nvidia.com/gpu": "1"}
    assert (
        requested_milli({"spec": {"containers": [{"resources": {"limits": both}}]}}, backend=backend) == 1250
    )


# A GPU resource no backend of the hub reads: a device plugin's `<vendor>/gpu` counts as whole
# GPUs; anything else is refused with its name, never counted as 0.
@pytest.mark.parametrize(
    "resources, counted",
    [
        ({"limits": {"amd.com/gpu": "2"}}, 2000),
        ({"requests": {"nvidia.com/gpu": "1"}, "limits": {"nvidia.com/gpu": "1"}}, 1000),
        ({"limits": {"nvidia.com/gpu.shared": "1"}}, "nvidia.com/gpu.shared is a GPU resource no sharing"),
        ({"limits": {"gpu.intel.com/i915": "1"}}, "gpu.intel.com/i915 is a GPU resource"),
        ({"limits": {"nvidia.com/gpumem": "8000"}}, "nvidia.com/gpumem without nvidia.com/gpu"),
        ({"requests": {"nvidia.com/gpucores": "30"}}, "nvidia.com/gpucores without"),
        ({"limits": {"nvidia.com/mps-core": "1"}}, "nvidia.com/mps-core is a GPU resource"),
        ({"limits": {"cpu": "2", "memory": "1Gi", "example.com/fpga": "1"}}, 0),
        ({"limits": {"amd.com/gpu": "-1"}}, "amd.com/gpu: -1 is not a number of devices"),
    ],
)
def test_a_gpu_resource_no_backend_reads_is_counted_whole_or_refused(resources, counted) -> None:
    manifest = {"spec": {"containers": [{"name": "c", "resources": resources}]}}
    if isinstance(counted, int):
        assert requested_milli(manifest, MEM, backend=make_backend("whole")) == counted
    else:
        with pytest.raises(UnreadableGPU, match=counted):
            requested_milli(manifest, MEM, backend=make_backend("whole"))


# Ways a profile, user option or hook could ask for more than the reservation; each is counted.
@pytest.mark.parametrize(
    "containers, annotations, counted",
    [
        ([{"limits": {"nvidia.com/gpu": "2"}}], {"gpu-fraction": "0.25"}, 2250),
        (
            [{"limits": {"nvidia.com/gpu": "4", "nvidia.com/gpucores": "25"}}],
            {},
            1000,
        ),  # HAMi: 4 devices x 25 %
        (
            [{"limits": {"nvidia.com/gpu": "1", "nvidia.com/gpucores": "10", "nvidia.com/gpumem": "81920"}}],
            {},
            1000,
        ),
        ([{"requests": {"nvidia.com/gpu": "1"}}], {}, 1000),  # requests only
        ([{}, {"limits": {"nvidia.com/gpu": "1"}}], {}, 1000),  # a second container
        ([{"limits": {"nvidia.com/mig-1g.10gb": "2"}}], {}, 250),
        ([{"limits": {"nvidia.com/mig-9g.999gb": "1"}}], {}, 1000),  # unknown profile: a whole GPU
        ([{}], {"gpu-memory": "20480"}, 250),
        ([{}], {"gpu-fraction": "0.7"}, 700),  # no float drift
    ],
)
def test_every_way_to_ask_for_gpu_is_counted(containers, annotations, counted) -> None:
    manifest = {
        "metadata": {"annotations": annotations},
        "spec": {"containers": [{"name": f"c{i}", "resources": r} for i, r in enumerate(containers)]},
    }
    assert requested_milli(manifest, MEM) == counted


def test_init_containers_count_as_kubernetes_counts_them() -> None:
    manifest = {
        "metadata": {},
        "spec": {
            "containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": "1"}}}],
            "initContainers": [
                {"name": "warm", "resources": {"limits": {"nvidia.com/gpu": "3"}}},
                {
                    "name": "sidecar",
                    "restartPolicy": "Always",
                    "resources": {"limits": {"nvidia.com/gpu": "1"}},
                },
            ],
        },
    }
    assert requested_milli(manifest) == 3000  # the init step needs 3 at once; the pod then runs 1 + 1


def test_memory_shares_without_the_device_size_count_as_a_whole_gpu() -> None:
    assert requested_milli({"metadata": {"annotations": {"gpu-memory": "100"}}, "spec": {}}) == 1000


# --- profiles filtered by groups and quota (kubespawner #589, #889) ---------------------------
LIMITS = BuildLimits(
    quota_milli=1000, sizes_milli=(250, 500, 1000), max_per_workspace_milli=500, max_workspaces=2
)
PROFILES = [
    {"display_name": "CPU only", "slug": "cpu"},
    {"display_name": "Quarter GPU", "slug": "quarter", "gpupool": {"gpus": 0.25}},
    {"display_name": "Half GPU", "slug": "half", "gpupool": {"gpus": 0.5}, "default": True},
    {"display_name": "Whole GPU", "slug": "whole", "gpupool": {"gpus": 1}},
    {"display_name": "Staff half GPU", "slug": "staff", "gpupool": {"gpus": 0.5, "groups": ["staff"]}},
]


def slugs(profiles: list[dict]) -> list[str]:
    return [p["slug"] for p in profiles]


def test_profiles_are_filtered_by_group_and_quota_left() -> None:
    assert slugs(filter_profiles(PROFILES, ["students"], LIMITS, 1000)) == ["cpu", "quarter", "half"]
    assert slugs(filter_profiles(PROFILES, ["staff"], LIMITS, 1000)) == ["cpu", "quarter", "half", "staff"]
    # with 0.75 GPU held elsewhere only 0.25 is left: the default (half) goes, so the first one left is default
    left = filter_profiles(PROFILES, ["students"], LIMITS, 250)
    assert slugs(left) == ["cpu", "quarter"] and left[0]["default"] is True


def test_a_profile_outside_the_offer_is_not_found() -> None:
    offered = filter_profiles(PROFILES, ["students"], LIMITS, 1000)
    assert find_profile(offered, "staff") is None
    assert find_profile(offered, None)["slug"] == "half"
    assert profile_milli(find_profile(offered, "quarter")) == 250


def test_a_profile_with_a_bad_gpu_value_is_refused_clearly() -> None:
    with pytest.raises(InvalidRequest, match="profile 'odd'"):
        profile_milli({"slug": "odd", "gpupool": {"gpus": "lots"}})
