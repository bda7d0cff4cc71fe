"""The train-Job controller's followers (gpupool.kube.follow) on the real API server: a trimmed
copy (what the job states are made of, none of the pod template or managedFields), read in
pages, and a watch that ends is resumed from where it was, not by listing everything again
(kubespawner's reflector listed every Job and pod at each watch timeout: at 2,000 Jobs the hub
grew to 408 MiB, benchmarks/kube)."""

from __future__ import annotations

import secrets

from kubernetes_asyncio import client

from gpupool.kube.follow import Follower, trim_pod
from tests.cluster.conftest import HUB_NS
from tests.cluster.resources import Resources
from tests.cluster.test_train_jobs_real import hub_api, wait_for  # noqa: F401


def pod(admin: Resources, name: str, label: str) -> None:
    admin.apply(
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": name,
                "namespace": HUB_NS,
                "labels": {"gpupool.test/follow": label},
                "annotations": {"note": "x" * 2000},
            },  # what a trimmed copy leaves out
            "spec": {
                "nodeName": "gpu-node-0",
                "containers": [{"name": "c", "image": "registry.example.org/x:1"}],
            },
        }
    )


async def test_a_trimmed_copy_read_in_pages_whose_watch_resumes_without_listing_again(
    hub_api, admin: Resources
) -> None:
    label = secrets.token_hex(4)
    names = [f"follow-{label}-{i}" for i in range(5)]
    for name in names:
        pod(admin, name, label)
    core = client.CoreV1Api(hub_api)
    f = Follower(
        core.list_namespaced_pod, HUB_NS, f"gpupool.test/follow={label}", trim_pod, watch_timeout_s=1, page=2
    )
    await f.start()
    try:
        assert sorted(f.resources) == sorted(f"{HUB_NS}/{n}" for n in names)
        assert (f.lists, f.pages) == (1, 3)  # five pods, two per page
        copy = f.resources[f"{HUB_NS}/{names[0]}"]
        # what the hub reads, nothing else: no spec, annotations, managedFields or unread labels
        assert set(copy) == {"metadata", "status"} and copy["metadata"]["uid"]
        # the namespace: with user namespaces a job's Job and pods live in its owner's
        assert set(copy["metadata"]) == {"name", "namespace", "uid", "resourceVersion", "labels"}
        assert copy["metadata"]["labels"] == {}  # only gpupool's job-id and hold labels are kept
        await wait_for(lambda: f.watches >= 3, what="watches that ended after their 1 s and were resumed")
        pod(admin, f"follow-{label}-new", label)
        admin.http.delete(f"/api/v1/namespaces/{HUB_NS}/pods/{names[0]}", params={"gracePeriodSeconds": "0"})
        await wait_for(
            lambda: (
                f"{HUB_NS}/follow-{label}-new" in f.resources and f"{HUB_NS}/{names[0]}" not in f.resources
            ),
            what="a new pod and a deletion",
        )
        await wait_for(
            lambda: f.resources[f"{HUB_NS}/{names[1]}"]["status"]["phase"] == "Running",
            what="kwok's Running, through the watch",
        )
        assert f.lists == 1  # never listed again
    finally:
        await f.stop()
        for name in [*names, f"follow-{label}-new"]:
            admin.http.delete(f"/api/v1/namespaces/{HUB_NS}/pods/{name}", params={"gracePeriodSeconds": "0"})
