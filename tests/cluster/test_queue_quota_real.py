"""KAI's queue quota at the form: GPUKubeSpawner, as the hub's account, reads the workspace's
KAI Queue (the chart's ClusterRole lets it get queues) and the queue's pods from the real API
server. With a queue of 0.5 GPU holding two quarter-GPU workspaces, a third is refused before its
pod is created, with the reason (before, the hub admitted it, KAI left it Pending with
NonPreemptibleOverQuota and the spawn failed at the start timeout); once one stops, it starts.
The binding is kube-scheduler's stand-in (plane.py): the refusal is the hub's, before KAI."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest
from tornado import web

from tests.cluster.conftest import HUB_NS
from tests.cluster.plane import ControlPlane
from tests.cluster.resources import Resources

QUEUE = "quota-half"


@pytest.fixture
def half_gpu_queue(chart: list[dict], admin: Resources) -> Iterator[str]:
    unlimited = {"quota": -1, "overQuotaWeight": 1, "limit": -1}
    admin.apply(
        {
            "apiVersion": "scheduling.run.ai/v2",
            "kind": "Queue",
            "metadata": {"name": QUEUE},
            "spec": {
                "parentQueue": "department-default",
                "resources": {
                    "gpu": {"quota": 0.5, "overQuotaWeight": 1, "limit": -1},
                    "cpu": unlimited,
                    "memory": unlimited,
                },
            },
        }
    )
    try:
        yield QUEUE
    finally:
        admin.http.delete(f"/apis/scheduling.run.ai/v2/queues/{QUEUE}")


async def test_a_workspace_the_kai_queue_cannot_run_is_refused_at_the_form_with_the_reason(
    half_gpu_queue: str, make_spawner, plane: ControlPlane
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
        await ann.stop()
        await asyncio.wait_for(cara.start(), 90)
    finally:
        for sp in (bob, cara):
            await sp.stop()
