"""A spawner for load tests only: every workspace's "server" is one shared HTTP responder, so
a real hub can hold hundreds of ready servers on a small machine. The GPU share handling
(gpupool's mixin: quota, placement, persisted share) is the real one; only the notebook
server process is replaced."""

from __future__ import annotations

import os

from jupyterhub.spawner import Spawner

from gpupool.spawner.mixin import GPUSpawnerMixin

RESPONDER_PORT = int(os.environ.get("GPUPOOL_TEST_RESPONDER_PORT", "0"))


class SharedServer(Spawner):
    running = False

    async def start(self):
        self.running = True
        return ("127.0.0.1", RESPONDER_PORT)

    async def stop(self, now: bool = False) -> None:
        self.running = False

    async def poll(self) -> int | None:
        return None if self.running else 0

    def get_state(self) -> dict:
        return {**super().get_state(), "running": self.running}

    def load_state(self, state: dict) -> None:
        super().load_state(state)
        self.running = bool(state.get("running"))


class SharedServerGPUSpawner(GPUSpawnerMixin, SharedServer):
    pass
