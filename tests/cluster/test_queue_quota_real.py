"""KAI's queue quota at the form: GPUKubeSpawner, as the hub's account, reads the workspace's
KAI Queue (the chart's ClusterRole lets it get queues) and the queue's pods from the real API
server. With a queue of 0.5 GPU holding two quarter-GPU workspaces, a third is refused before its
pod is created, with the reason (before, the hub admitted it, KAI left it Pending with
NonPreemptibleOverQuota and the spawn failed at the start timeout); once one stops, it starts.
The binding is kube-scheduler's stand-in (plane.py): the refusal is the hub's, before KAI.
The hub reads the Queue once per kai_queue_cache_s, not at every spawn: an admin's raise of the
quota counts once that time has passed."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator

import pytest
from tornado import web

from gpupool.spawner import kube
from tests.cluster.conftest import HUB_NS
from tests.cluster.plane import ControlPlane
from tests.cluster.resources import Resources

QUEUE = "quota-half"


def queue(gpus: float) -> dict:
    unlimited = {"quota": -1, "overQuotaWeight": 1, "limit": -1}
    return {
        "apiVersion": "scheduling.run.ai/v2",
        "kind": "Queue",
        "metadata": {"name": QUEUE},
        "spec": {
            "parentQueue": "department-default",
            "resources": {
                "gpu": {"quota": gpus, "overQuotaWeight": 1, "limit": -1},
                "cpu": unlimited,
                "memory": unlimited,
            },
        },
    }


@pytest.fixture
def half_gpu_queue(chart: list[dict], admin: Resources) -> Iterator[str]:
    admin.apply(queue(0.5))
    try:
        yield QUEUE
    finally:
        admin.http.delete(f"/apis/scheduling.run.ai/v2/queues/{QUEUE}")


async def test_a_workspace_the_kai_queue_cannot_run_is_refused_at_the_form_with_the_reason(
    half_gpu_queue: str, make_spawner, plane: ControlPlane, admin: Resources, monkeypatch: pytest.MonkeyPatch
) -> None:
    ann, bob, cara = (make_spawner(u, server="q", kai_queue=half_gpu_queue) for u in ("ann", "bob", "cara"))
    await asyncio.wait_for(ann.start(), 90)
    await asyncio.wait_for(bob.start(), 90)
    asked = plane.created("pods", HUB_NS).count(cara.pod_name)
    try:
        with pytest.raises(web.HTTPError) as err:
            await cara.start()
        assert err.value.status_code == 403
        assert err.value.jupyterhub_message == (
            f"the '{QUEUE}' queue's quota is 0.5 GPU and its workspaces hold 0.5: KAI-Scheduler would not"
            " start a 0.25 GPU workspace now; try again when one of them stops, or ask for less"
        )
        assert plane.created("pods", HUB_NS).count(cara.pod_name) == asked  # never asked for
        assert cara.pool.store.allocations(owner="cara") == []  # nothing held for it
        admin.apply(queue(0.75))  # the admin raises the quota: the hub's read of 0.5 still serves
        with pytest.raises(web.HTTPError, match="quota is 0.5 GPU"):
            await cara.start()
        monkeypatch.setattr(kube, "monotonic", lambda: time.monotonic() + cara.kai_queue_cache_s)
        await asyncio.wait_for(cara.start(), 90)  # read again once its time has passed
        await cara.stop()
        admin.apply(queue(0.5))
        monkeypatch.setattr(kube, "monotonic", lambda: time.monotonic() + 2 * cara.kai_queue_cache_s)
        await ann.stop()  # bob alone holds 0.25 of 0.5: cara fits
        await asyncio.wait_for(cara.start(), 90)
    finally:
        for sp in (bob, cara):
            await sp.stop()
