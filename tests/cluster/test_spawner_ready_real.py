"""GPUKubeSpawner's start returns once its pod runs, looking at kubespawner's pod reflector
every `ready_poll_s` instead of kubespawner's backoff alone (spawner/kube_ready.py; the time it
saves is measured by benchmarks/kube), and an admin's own after_pod_created_hook still runs.
kubespawner's reflectors, as GPUKubeSpawner starts them, keep each pod and event without the
managedFields the API server sends (spawner/kube_reflector.py: a third of what the hub holds per
workspace), and everything kubespawner reads of them."""

from __future__ import annotations

import asyncio

from tests.cluster.conftest import HUB_NS


async def test_start_returns_with_the_pod_running_and_the_admins_hook_run_and_the_reflector_trimmed(
    make_spawner,
) -> None:
    seen: list[str] = []

    def admins_hook(spawner, pod) -> None:  # e.g. an Ingress for the pod, as kubespawner documents
        seen.append(pod["metadata"]["uid"])

    sp = make_spawner(
        "ann", "ready", more=lambda c: setattr(c.KubeSpawner, "after_pod_created_hook", admins_hook)
    )
    assert getattr(sp.after_pod_created_hook, "_gpupool_waits_for_running", False)
    await asyncio.wait_for(sp.start(), 90)
    pod = sp.pod_reflector.pods[f"{HUB_NS}/{sp.pod_name}"]
    assert sp.is_pod_running(pod)
    assert seen == [pod["metadata"]["uid"]]
    # the API server's copy has managedFields; the hub's has all else (the pod's IP, its
    # containers' states and its uid, read above, included)
    sent = sp.api.api_client.sanitize_for_serialization(await sp.api.read_namespaced_pod(sp.pod_name, HUB_NS))
    assert sent["metadata"]["managedFields"] and "managedFields" not in pod["metadata"]
    assert set(sent["metadata"]) - {"managedFields"} == set(pod["metadata"])
    assert (sent["metadata"]["labels"], sent["metadata"]["annotations"]) == (
        pod["metadata"]["labels"],
        pod["metadata"]["annotations"],
    )
    events = list(sp.event_reflector.resources.values())
    assert events and not any("managedFields" in e["metadata"] for e in events)
    await sp.stop()
