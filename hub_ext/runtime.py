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
        _pool.node_pools = node_pools(config or Config(), quotas)
    return _pool


def node_pools(config: Config, quotas) -> dict:
    """c.TrainPool.node_pools (one definition for train jobs and build workspaces), checked
    against the pools the build quotas name."""
    from traitlets import TraitError

    from .train.config import TrainPool

    pools = TrainPool(config=config).pool_table()
    for group, limits in [("build_pools", quotas.default), *quotas.group_overrides.items()]:
        unknown = set(limits.pools) - set(pools)
        if unknown:
            where = "GPUPool.build_pools" if group == "build_pools" else f"GPUPool.group_overrides[{group!r}]"
            raise TraitError(f"{where}: pools {sorted(unknown)} are not in TrainPool.node_pools ({sorted(pools)})")
    return pools


def reset() -> None:
    """Forget the singletons (tests that build several hubs in one process)."""
    global _pool, _settings
    _pool = _settings = None
