"""gpupool's hub side: configuration, the pool owner, the REST API, and the pure pool core."""

from .setup import configure

__all__ = ["configure"]
