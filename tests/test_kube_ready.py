"""A Kubernetes workspace's start returns as soon as its pod runs (gpupool.spawner.kube_ready):
the wait reads kubespawner's pod reflector (with gpupool's, only when the pod changes), an
admin's own after_pod_created_hook still runs, and the wait never decides the outcome itself
(kubespawner's checks and messages do)."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest
from traitlets import Any as AnyTrait
from traitlets import Dict, Float, HasTraits

from gpupool.spawner import kube_ready, kube_reflector
from gpupool.spawner.kube_ready import PromptStart, wait_until_running

RUNNING = {
    "metadata": {"uid": "u"},
    "status": {"phase": "Running", "podIP": "10.0.0.7", "containerStatuses": [{"ready": True}]},
}


class Kube(HasTraits):
    """The two traits of KubeSpawner the mixin works with."""

    after_pod_created_hook = AnyTrait(None, allow_none=True)
    start_timeout = Float(5.0)


class Spawner(PromptStart, Kube):  # as GPUKubeSpawner mixes it in before KubeSpawner
    def __init__(self, **kw) -> None:
        super().__init__(**kw)
        self.namespace, self.pod_name = "ns", "jupyter-ann"
        self.pod_reflector = SimpleNamespace(pods={})
        self.looks = 0

    def is_pod_running(self, pod) -> bool:
        self.looks += 1
        return (
            pod is not None
            and pod["status"]["phase"] == "Running"
            and pod["status"]["podIP"] is not None
            and all(c["ready"] for c in pod["status"]["containerStatuses"])
        )


async def test_the_wait_ends_at_the_first_look_after_the_pod_runs() -> None:
    sp = Spawner(ready_poll_s=0.01)
    waiting = asyncio.create_task(wait_until_running(sp, 5.0, sp.ready_poll_s))
    sp.pod_reflector.pods["ns/jupyter-ann"] = {"metadata": {}, "status": {"phase": "Pending"}}
    while sp.looks < 3:  # it keeps looking while the pod is pending
        await asyncio.sleep(0.01)
    assert not waiting.done()
    looks = sp.looks
    sp.pod_reflector.pods["ns/jupyter-ann"] = RUNNING
    await asyncio.wait_for(waiting, 2)
    assert sp.looks <= looks + 2  # one more look (two if the flip fell between a look and its sleep)


@pytest.mark.parametrize("pod", [{"metadata": {}, "status": {"phase": "Failed"}}, None])
async def test_an_ended_or_missing_pod_is_left_to_kubespawner(pod) -> None:
    sp = Spawner(ready_poll_s=0.01)
    if pod is not None:
        sp.pod_reflector.pods["ns/jupyter-ann"] = pod
    await asyncio.wait_for(
        wait_until_running(sp, 0.1 if pod is None else 5.0, 0.01), 2
    )  # returns, never raises


async def test_the_admins_hook_runs_first_and_zero_turns_the_wait_off() -> None:
    calls: list[str] = []

    async def admins_hook(spawner, pod) -> None:
        calls.append(f"hook saw {len(spawner.pod_reflector.pods)} pods")

    sp = Spawner(ready_poll_s=0.01, after_pod_created_hook=admins_hook)
    waiting = asyncio.create_task(sp.after_pod_created_hook(sp, {}))
    await asyncio.sleep(0.05)
    assert calls == ["hook saw 0 pods"] and not waiting.done()  # hook ran, now waiting for the pod
    sp.pod_reflector.pods["ns/jupyter-ann"] = RUNNING
    await asyncio.wait_for(waiting, 2)
    off = Spawner(ready_poll_s=0)
    await asyncio.wait_for(off.after_pod_created_hook(off, {}), 1)  # kubespawner's own wait alone
    assert off.looks == 0


class Reflector(HasTraits):
    """kubespawner's reflector as far as the store goes: `resources`, replaced by each list."""

    resources = Dict()

    @property
    def pods(self):
        return self.resources


class TrimmedReflector(kube_reflector.TrimmedReflector, Reflector):  # as GPUKubeSpawner's
    pass


async def test_with_gpupools_reflector_the_wait_looks_only_when_the_pod_changes() -> None:
    sp = Spawner(ready_poll_s=0.001)
    sp.pod_reflector = reflector = TrimmedReflector()
    reflector.resources = {}  # the first list
    waiting = asyncio.create_task(wait_until_running(sp, 5.0, sp.ready_poll_s))
    await asyncio.sleep(0.05)  # fifty polling periods
    assert sp.looks == 1 and not waiting.done()  # one look, then asleep until the pod changes
    reflector.resources["ns/jupyter-ann"] = {
        "metadata": {"managedFields": [{}]},
        "status": {"phase": "Pending"},
    }
    for _ in range(5):  # the future's callback, then the waiting task: a few turns of the loop
        await asyncio.sleep(0)
    assert sp.looks == 2 and not waiting.done()
    assert reflector.pods["ns/jupyter-ann"]["metadata"] == {}  # kept without its managedFields
    reflector.resources = {"ns/jupyter-ann": RUNNING}  # a relist replaced the store: looked at again
    await asyncio.wait_for(waiting, kube_ready.RECHECK_S / 2)  # at once, not at the next recheck
    assert sp.looks == 3
