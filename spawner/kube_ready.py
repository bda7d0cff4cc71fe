"""A workspace's start returns as soon as its pod runs.

kubespawner waits for the pod by polling its pod reflector with JupyterHub's exponential
backoff: jittered waits of up to 0.2, 0.4, 0.8, 1.6 and 3.2 s, so a pod that runs after one
second is noticed half a second to two seconds later (benchmarks/kube: spawn -> running
2.6 s p50 where bare pod creates take 1.4 s, with 20 spawns in flight that is half the
throughput). kubespawner's public `after_pod_created_hook` runs between the pod's creation and
that wait: gpupool's hook waits on the same reflector, so kubespawner's first look finds the pod
running. It looks each time the reflector stores the pod (gpupool.spawner.kube_reflector wakes
it), not every few milliseconds: with 20 spawns in flight a 50 ms poll was 400 looks a second
of the hub's CPU (benchmarks.kube, CPU per spawn). An admin's own hook runs first, unchanged.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from jupyterhub.utils import maybe_future
from traitlets import Float, HasTraits, default, validate

from gpupool.spawner.kube_reflector import TrimmedStore

if TYPE_CHECKING:
    from jupyterhub.spawner import Spawner

_WAITS = "_gpupool_waits_for_running"
DONE = ("Failed", "Succeeded")  # a pod that ended: kubespawner's own checks say what happened


def pod_running(spawner: Spawner, pod: dict[str, Any] | None) -> bool:
    try:
        return bool(spawner.is_pod_running(pod))
    except (KeyError, TypeError):  # a pod status still being filled in
        return False


RECHECK_S = 1.0  # a wait woken by the reflector still looks this often (a reflector replaced)


async def wait_until_running(spawner: Spawner, timeout_s: float, interval_s: float) -> None:
    """Until the spawner's pod runs (or ended, or `timeout_s` passed): never raises, so that
    kubespawner's own wait and its error messages decide the outcome. With gpupool's reflector
    (gpupool.spawner.kube_reflector) it looks each time the reflector stores the pod, and at
    least every RECHECK_S; with another, every `interval_s`."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    ref = f"{spawner.namespace}/{spawner.pod_name}"
    while loop.time() < deadline:
        reflector = spawner.pod_reflector
        pods = reflector.pods if reflector is not None else {}
        pod = pods.get(ref)
        if pod_running(spawner, pod) or ((pod or {}).get("status") or {}).get("phase") in DONE:
            return
        left = deadline - loop.time()
        if isinstance(pods, TrimmedStore):
            await asyncio.wait([pods.changed(ref)], timeout=min(RECHECK_S, max(left, 0)))
        else:
            await asyncio.sleep(min(interval_s, max(left, 0)))


class PromptStart(HasTraits):
    """Mix in before KubeSpawner."""

    ready_poll_s = Float(
        0.05,
        min=0.0,
        config=True,
        help="""Whether a starting workspace's start returns as soon as its pod runs: it looks
        at kubespawner's pod reflector (no API call) each time the reflector stores its pod, or
        every this many seconds where the reflector is not gpupool's. kubespawner alone waits
        with a backoff of up to seconds between looks; 0 leaves it at that. Example::

            c.GPUKubeSpawner.ready_poll_s = 0.1
        """,
    )

    @default("after_pod_created_hook")
    def _default_after_created(self) -> Callable[..., object]:
        return self._then_wait(None)

    @validate("after_pod_created_hook")
    def _wrap_after_created(self, proposal: dict[str, Any]) -> Callable[..., object]:
        hook = proposal["value"]
        return hook if getattr(hook, _WAITS, False) else self._then_wait(hook)

    def _then_wait(self, hook: Callable[..., object] | None) -> Callable[..., object]:
        async def then_wait(spawner: Spawner, pod: object) -> None:
            if hook is not None:
                await maybe_future(hook(spawner, pod))  # sync or async, as kubespawner allows
            if spawner.ready_poll_s > 0:
                await wait_until_running(spawner, spawner.start_timeout, spawner.ready_poll_s)

        setattr(then_wait, _WAITS, True)
        return then_wait
