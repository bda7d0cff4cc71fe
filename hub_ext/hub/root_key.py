"""Where the hub's tornado settings hold gpupool's composition root, and the error when they do
not. The root (gpupool.wiring.root.GPUPoolHub) is put there by `configure(c)`; the parts that read
it (spawners, the gpupool API's handlers) each name what they read of it as a Protocol of their own
(gpupool.spawner.hub_parts.SpawnerRoot, gpupool.api.auth.ApiRoot), so none imports the root, which
sits above them all."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

ROOT_KEY = "gpupool_root"  # its key in the hub's tornado settings and in the gpupool API's


class NotConfigured(RuntimeError):
    """A gpupool spawner or page in a hub whose config never called `configure(c)`."""


def stored_root(settings: Mapping[str, object] | None) -> Any:
    """The root in a tornado settings dict (a User's `settings`, a handler's `settings`), typed by
    the caller as the Protocol it reads (tornado's settings hold untyped values)."""
    root = (settings or {}).get(ROOT_KEY)
    if root is None:
        raise NotConfigured(
            "gpupool is not set up in this hub: add `from gpupool import configure; configure(c)`"
            " at the end of jupyterhub_config.py"
        )
    return root
