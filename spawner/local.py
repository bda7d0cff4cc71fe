"""Embedded mode: workspaces as local processes on a GPU share."""

from __future__ import annotations

from jupyterhub.spawner import LocalProcessSpawner, SimpleLocalProcessSpawner

from .mixin import GPUSpawnerMixin


class _LocalGPU(GPUSpawnerMixin):
    """Lifecycle for local-process spawners: reserve before start, release on every end."""

    def get_env(self) -> dict[str, str]:
        env = super().get_env()
        env.update(self.gpu_environment(env.get("PYTHONPATH", "")))
        return env

    async def start(self):
        self.reserve_gpus()
        try:
            url = await super().start()
        except BaseException:
            self.release_gpus("start failed")
            raise
        self.pool.mark_running(self.workload, self.pid)
        return url

    async def stop(self, now: bool = False) -> None:
        try:
            await super().stop(now=now)
        finally:
            self.release_gpus("stopped")

    async def poll(self) -> int | None:
        status = await super().poll()
        if status is not None and not self._spawn_pending:
            self.release_gpus(f"server process ended (status {status})")
        elif status is None and self.gpupool_allocation is None:
            # a hub restart: re-adopt the persisted share of a server that is still running
            self.gpupool_allocation = self.pool.allocation(self.workload)
        return status


class GPULocalProcessSpawner(_LocalGPU, LocalProcessSpawner):
    """LocalProcessSpawner on a GPU share (users are system accounts)."""


class GPUSimpleLocalProcessSpawner(_LocalGPU, SimpleLocalProcessSpawner):
    """SimpleLocalProcessSpawner on a GPU share: no system accounts needed (demos, tests,
    teaching machines where everyone is one Unix user). Not isolated: see its parent."""
