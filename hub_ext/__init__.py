"""gpupool: share scarce GPUs from JupyterHub.

The import name `gpupool` is this folder (`hub_ext/`, the hub side and the pure pool core); the
workspace spawners, the culler service and the notebook widgets install beneath it as
`gpupool.spawner`, `gpupool.idle_culler` and `gpupool.widgets`.

In `jupyterhub_config.py`: `from gpupool import configure; configure(c)`.
In a notebook: `%load_ext gpupool`.
"""

__all__ = ["configure", "load_ipython_extension"]


def __getattr__(name: str):
    # lazy, so that small stdlib-only parts (the job wrapper) and the kernel side import without
    # the hub's dependencies, and importing a subpackage never pulls in the hub set-up
    if name == "configure":
        from gpupool.wiring.setup import configure

        return configure
    raise AttributeError(name)


def load_ipython_extension(ipython) -> None:
    """`%load_ext gpupool`: registers `%gpupool` and `%%train` (see gpupool.widgets)."""
    from gpupool.widgets.magics import register

    register(ipython)
