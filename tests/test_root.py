"""The composition root reaches spawners and pages through JupyterHub's own settings: one root per
hub, the one `configure(c)` built, whatever copies of its config JupyterHub makes."""

from __future__ import annotations

from pathlib import Path

import pytest
from traitlets.config import Config

from gpupool.wiring.root import NotConfigured, root_of


def hub_config(tmp_path: Path, admins_settings: str) -> Config:
    from gpupool.wiring.setup import configure

    c = Config()
    c.GPUPool.db_url = f"sqlite:///{tmp_path}/gpupool.sqlite"
    c.GPUPool.use_nvml = False
    c.GPUPool.virtual_gpus = 1
    if admins_settings == "assigned":
        c.JupyterHub.tornado_settings = {"slow_spawn_timeout": 20}
    elif admins_settings == "updated":  # traitlets keeps this as a lazy update of the default
        c.JupyterHub.tornado_settings.update({"slow_spawn_timeout": 20})
    configure(c)  # no event loop here: it wires the config and starts nothing
    return c


@pytest.mark.parametrize("admins_settings", ["none", "assigned", "updated"])
def test_every_load_of_the_hub_config_hands_out_the_one_root(tmp_path: Path, admins_settings: str) -> None:
    """JupyterHub deep-copies its tornado_settings when it loads them (traitlets), and gives
    those settings to every User, whose spawners read the root there: a copy would be a second
    pool manager over the same database, with its own view of who holds which GPU. An admin's
    own tornado settings, however set, stay."""
    from jupyterhub.app import JupyterHub

    c = hub_config(tmp_path, admins_settings)
    first, second = JupyterHub(config=c), JupyterHub(config=c)
    root = root_of(first.tornado_settings)
    assert root_of(second.tornado_settings) is root
    if admins_settings != "none":
        assert first.tornado_settings["slow_spawn_timeout"] == 20
    assert root.pool is root_of(second.tornado_settings).pool  # one pool: built once, on first use
    assert root.pool.inventory.gpu_count == 1  # from this hub's c.GPUPool


def test_a_gpupool_spawner_in_a_hub_without_configure_says_what_to_add() -> None:
    with pytest.raises(NotConfigured, match=r"configure\(c\)"):
        root_of({"base_url": "/"})  # a User's settings in a hub whose config never called it
