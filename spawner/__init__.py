"""Spawners that start build workspaces on GPU shares."""

from gpupool.spawner.local import GPULocalProcessSpawner, GPUSimpleLocalProcessSpawner
from gpupool.spawner.mixin import GPUSpawnerMixin

__all__ = ["GPULocalProcessSpawner", "GPUSimpleLocalProcessSpawner", "GPUSpawnerMixin"]
