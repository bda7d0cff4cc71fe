"""The hub process's single PoolManager, built once from the GPUPool config."""

from __future__ import annotations

import logging

from traitlets.config import Config

from .config import GPUPool, policy_from_document, quota_document
from .manager import PoolManager
from .nvml import discover_gpus
from .pool import Inventory, Node, get_policy, virtual_inventory

log = logging.getLogger("gpupool")
QUOTAS_SETTING = "quotas"
_pool: PoolManager | None = None
_settings: GPUPool | None = None
api_settings: dict | None = None  # the gpupool API app's settings, once it runs


def settings(config: Config | None = None) -> GPUPool:
    global _settings
    if _settings is None:
        _settings = GPUPool(config=config or Config())
    return _settings


def build_inventory(cfg: GPUPool) -> Inventory:
    gpus = discover_gpus() if cfg.use_nvml else []
    if gpus:
        log.info("NVML found %d GPU(s): %s", len(gpus), ", ".join(g.model for g in gpus))
        return Inventory(nodes=(Node(name="localhost", gpus=tuple(gpus)),))
    if cfg.virtual_gpus:
        log.warning("no NVIDIA GPU found: declaring %d VIRTUAL GPU(s) of %d MiB",
                    cfg.virtual_gpus, cfg.virtual_gpu_memory_mib)
    return virtual_inventory(cfg.virtual_gpus, cfg.virtual_gpu_memory_mib)


def pool(config: Config | None = None) -> PoolManager:
    """The process-wide manager (created on first use)."""
    global _pool
    if _pool is None:
        from .store import Store

        cfg = settings(config)
        store = Store(cfg.db_url)
        quotas = cfg.quota_policy()
        changed = store.get_setting(QUOTAS_SETTING)
        if changed:
            log.info("quotas changed through the API override the config: %s", sorted(changed))
            quotas = policy_from_document({**quota_document(cfg), **changed})
        _pool = PoolManager(
            inventory=build_inventory(cfg),
            store=store,
            quotas=quotas,
            policy=get_policy(cfg.build_placement_policy),
        )
    return _pool


def reset() -> None:
    """Forget the singletons (tests that build several hubs in one process)."""
    global _pool, _settings
    _pool = _settings = None
