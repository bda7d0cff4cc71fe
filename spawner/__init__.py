"""Spawners that start build workspaces on GPU shares."""

from .local import GPULocalProcessSpawner, GPUSimpleLocalProcessSpawner
from .mixin import GPUSpawnerMixin

__all__ = ["GPULocalProcessSpawner", "GPUSimpleLocalProcessSpawner", "GPUSpawnerMixin"]
