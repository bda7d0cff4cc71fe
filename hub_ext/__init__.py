"""gpupool's hub side: configuration, the pool owner, the REST API, and the pure pool core."""

__all__ = ["configure"]


def __getattr__(name: str):
    # lazy, so that small stdlib-only parts (the job wrapper) import without the hub's dependencies
    if name == "configure":
        from .setup import configure

        return configure
    raise AttributeError(name)
