"""A workspace's share follows its process, not the stop call: a stop that failed while the
server still runs keeps the share; one whose server is gone gives it back."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from types import SimpleNamespace

import pytest
from traitlets.config import Config

from gpupool.pool import BuildLimits
from gpupool.spawner.mixin import GPUSpawnerMixin
from gpupool.wiring.root import ROOT_KEY, GPUPoolHub
from tests.support.pools import make_pool


class Server:
    """The spawner below the mixin: a server process that may refuse to stop."""

    def __init__(self, stop_fails: bool, dies_anyway: bool) -> None:
        self.stop_fails, self.dies_anyway, self.running = stop_fails, dies_anyway, True

    async def stop(self, now: bool = False) -> None:
        if self.stop_fails:
            self.running = not self.dies_anyway
            raise RuntimeError("could not reach the server")
        self.running = False

    async def poll(self) -> int | None:
        return None if self.running else 0


class Spawner(GPUSpawnerMixin, Server):
    def __init__(self, root: GPUPoolHub, stop_fails: bool, dies_anyway: bool = False) -> None:
        Server.__init__(self, stop_fails, dies_anyway)
        # the hub's tornado settings reach a spawner through its User, as JupyterHub hands them
        self.user = SimpleNamespace(name="ann", groups=[], settings={ROOT_KEY: root})
        self.name, self._log_name, self.log = "", "ann/", logging.getLogger("test")


@pytest.fixture
def root(tmp_path: Path) -> GPUPoolHub:
    return GPUPoolHub(Config(), pool=make_pool(tmp_path, 1, limits=BuildLimits(1000, (500, 1000), 1000, 2)))


@pytest.mark.parametrize(
    "stop_fails, dies_anyway, kept", [(True, False, True), (True, True, False), (False, False, False)]
)
def test_a_failed_stop_keeps_the_share_while_the_server_runs(
    root: GPUPoolHub, stop_fails: bool, dies_anyway: bool, kept: bool
) -> None:
    pool = root.pool
    sp = Spawner(root, stop_fails, dies_anyway)
    sp.reserve_milli(500)
    if stop_fails:
        with pytest.raises(RuntimeError):
            asyncio.run(sp.stop())
    else:
        asyncio.run(sp.stop())
    assert (len(pool.store.allocations()) == 1) is kept
    # the second user can take the GPU only when the first server is really gone
    assert pool.state.copy().gpu_free.sum() == (500 if kept else 1000)
