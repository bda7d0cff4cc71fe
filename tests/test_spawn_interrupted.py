"""A hub that goes down in the middle of a spawn (on Kubernetes: its pod deleted, so SIGTERM and
JupyterHub's shutdown cancelling the pending spawn) keeps the share it persisted before it created
the server: the restarted hub either adopts that server and counts the share once, or releases it
at its start-up reconcile; a stop cut short the same way keeps the share while the pod
terminates and gives it back once it is gone. Before, the cancelled spawn released the share while the pod lived on,
and the adopted workspace held a GPU that no quota counted. On SQLite and on PostgreSQL."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from types import SimpleNamespace

import pytest
from tornado import web
from traitlets.config import Config

from gpupool.pool import BuildLimits
from gpupool.spawner.mixin import GPUSpawnerMixin
from gpupool.wiring.root import ROOT_KEY, GPUPoolHub
from tests.support.pools import make_pool

LIMITS = BuildLimits(1000, (500, 1000), 1000, 2)  # one GPU per user, half or whole


class Pod:
    """The server in the cluster: it outlives the hub, as a pod does."""

    running = False


class Kube:
    """The spawner below the mixin: it creates the pod, then waits for it to be ready."""

    pod: Pod

    async def start(self) -> str:
        self.pod.running = True  # created; the hub goes down while it waits for it to be ready
        await asyncio.Event().wait()
        return "http://pod:8888"

    async def poll(self) -> int | None:
        return None if self.pod.running else 0

    async def stop(self, now: bool = False) -> None:
        self.pod.running = False


class Spawner(GPUSpawnerMixin, Kube):
    start_timeout = 60

    def __init__(self, root: GPUPoolHub, pod: Pod, pending: str | None = None, name: str = "") -> None:
        self.pod = pod
        # the hub's tornado settings reach a spawner through its User, as JupyterHub hands them
        self.user = SimpleNamespace(name="ann", groups=[], settings={ROOT_KEY: root})
        self.name, self._log_name, self.log = name, f"ann/{name}", logging.getLogger("test")
        self.user_options, self.pending = {"gpus": "0.5"}, pending


def hub(tmp_path: Path, db: str) -> GPUPoolHub:
    return GPUPoolHub(Config(), pool=make_pool(tmp_path, 1, limits=LIMITS, db=db))


def interrupted_spawn(root: GPUPoolHub, pod: Pod) -> None:
    async def go() -> None:
        spawn = asyncio.create_task(Spawner(root, pod, pending="spawn").start())
        while not pod.running:  # the share is reserved and the pod created
            await asyncio.sleep(0)
        spawn.cancel()  # the hub's shutdown
        with pytest.raises(asyncio.CancelledError):
            await spawn

    asyncio.run(go())


@pytest.mark.parametrize("adopted", [True, False], ids=["pod-adopted", "pod-gone"])
def test_a_spawn_interrupted_by_the_hubs_shutdown_counts_its_share_once_after_the_restart(
    tmp_path: Path, store_url: str, adopted: bool
) -> None:
    pod = Pod()
    interrupted_spawn(hub(tmp_path, store_url), pod)
    if not adopted:
        pod.running = False  # deleted meanwhile (or never scheduled): the restarted hub does not know it
    again = hub(tmp_path, store_url)  # the restarted hub: the same database, nothing in memory
    released = again.pool.reconcile(lambda row: pod.running)
    if not adopted:
        assert len(released) == 1
        assert again.pool.store.allocations() == [] and again.pool.state.copy().gpu_free.sum() == 1000
        return
    assert released == []
    adopting = Spawner(again, pod)
    assert asyncio.run(adopting.poll()) is None and adopting.gpupool_allocation is not None
    # counted once: half the GPU held by ann's adopted workspace, her quota has half left
    assert again.pool.state.copy().gpu_free.sum() == 500
    second = Spawner(again, Pod(), name="big")
    with pytest.raises(web.HTTPError, match="QuotaExceeded"):  # a whole GPU more: over her quota of one
        second.reserve_milli(1000)
    asyncio.run(adopting.stop())  # and its stop gives it back, once
    assert again.pool.store.allocations() == [] and again.pool.state.copy().gpu_free.sum() == 1000


class TerminatingKube(Kube):
    async def stop(self, now: bool = False) -> None:
        await asyncio.Event().wait()  # the pod terminates; it is still running meanwhile


class StopSpawner(GPUSpawnerMixin, TerminatingKube):
    start_timeout = 60
    __init__ = Spawner.__init__


@pytest.mark.parametrize("gone", [True, False], ids=["pod-gone-later", "pod-still-terminating"])
def test_a_stop_interrupted_by_the_hubs_shutdown_keeps_the_share_until_the_pod_is_gone(
    tmp_path: Path, store_url: str, gone: bool
) -> None:
    root, pod = hub(tmp_path, store_url), Pod()
    pod.running = True
    running = StopSpawner(root, pod)
    running.reserve_milli(500)
    root.pool.mark_running(running.workload, None)

    async def interrupted_stop() -> None:
        stop = asyncio.create_task(running.stop())
        await asyncio.sleep(0)
        stop.cancel()  # the hub's shutdown while the pod terminates
        with pytest.raises(asyncio.CancelledError):
            await stop

    asyncio.run(interrupted_stop())
    # the pod still runs (terminating): its share stays counted, nothing handed on
    assert len(root.pool.store.allocations()) == 1 and root.pool.state.copy().gpu_free.sum() == 500
    if gone:
        pod.running = False  # its grace period ended while the hub was down
    again = hub(tmp_path, store_url)  # the restarted hub
    released = again.pool.reconcile(lambda row: pod.running)
    if gone:
        assert len(released) == 1 and again.pool.store.allocations() == []
        assert again.pool.state.copy().gpu_free.sum() == 1000
        return
    assert released == []
    adopting = Spawner(again, pod)
    assert asyncio.run(adopting.poll()) is None and adopting.gpupool_allocation is not None
    assert again.pool.state.copy().gpu_free.sum() == 500  # counted once
    pod.running = False  # it ends; the next poll gives the share back, once
    assert asyncio.run(adopting.poll()) == 0
    assert again.pool.store.allocations() == [] and again.pool.state.copy().gpu_free.sum() == 1000
