"""The hub process's single PoolManager, built once from the GPUPool config."""

from __future__ import annotations

import logging

from traitlets.config import Config

from gpupool.config import GPUPool, policy_from_document, quota_document
from gpupool.kinds import EventKind
from gpupool.manager import PoolManager
from gpupool.nvml import discover_gpus
from gpupool.pool import Inventory, Node, get_policy, virtual_inventory

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
        log.warning(
            "no NVIDIA GPU found: declaring %d VIRTUAL GPU(s) of %d MiB",
            cfg.virtual_gpus,
            cfg.virtual_gpu_memory_mib,
        )
    return virtual_inventory(cfg.virtual_gpus, cfg.virtual_gpu_memory_mib)


def pool(config: Config | None = None) -> PoolManager:
    """The process-wide manager (created on first use)."""
    global _pool
    if _pool is None:
        from gpupool.store import Store

        cfg = settings(config)
        store = Store(cfg.db_url)
        quotas, skipped = stored_quotas(cfg, store, config or Config())
        _pool = PoolManager(
            inventory=build_inventory(cfg),
            store=store,
            quotas=quotas,
            policy=get_policy(cfg.build_placement_policy),
        )
        _pool.node_pools = node_pools(config or Config(), quotas)
        _pool.skipped_settings = skipped
    return _pool


def stored_quotas(cfg: GPUPool, store, config: Config):
    """The build quotas in force: the config file's with the API's stored changes over them. Stored
    changes that no longer validate (a node pool since removed from the config...) are reported and
    skipped, never taking the hub down: (policy, {setting: why skipped})."""
    from traitlets import TraitError

    changed = store.get_setting(QUOTAS_SETTING)
    if not changed:
        return cfg.quota_policy(), {}
    try:
        quotas = policy_from_document({**quota_document(cfg), **changed})
        node_pools(config, quotas)
    except (TraitError, ValueError) as err:
        why = (
            f"the quota changes stored through the API ({sorted(changed)}) no longer validate and are"
            f" skipped: {err}; the config file's quotas apply until an admin changes them again (PUT"
            " api/quotas) or resets them (DELETE api/quotas)"
        )
        log.error("%s", why)
        store.record(EventKind.SETTING_SKIPPED, why, setting=QUOTAS_SETTING)
        return cfg.quota_policy(), {QUOTAS_SETTING: why}
    log.info("quotas changed through the API override the config: %s", sorted(changed))
    return quotas, {}


def node_pools(config: Config, quotas) -> dict:
    """c.TrainPool.node_pools (one definition for train jobs and build workspaces), checked
    against the pools the build quotas name."""
    from traitlets import TraitError

    from gpupool.train.config import TrainPool

    pools = TrainPool(config=config).pool_table()
    for group, limits in [("build_pools", quotas.default), *quotas.group_overrides.items()]:
        unknown = set(limits.pools) - set(pools)
        if unknown:
            where = "GPUPool.build_pools" if group == "build_pools" else f"GPUPool.group_overrides[{group!r}]"
            raise TraitError(
                f"{where}: pools {sorted(unknown)} are not in TrainPool.node_pools ({sorted(pools)})"
            )
    return pools


def reset() -> None:
    """Forget the singletons (tests that build several hubs in one process)."""
    global _pool, _settings
    _pool = _settings = None


_cgroups = None


def hub_key(config: Config | None = None) -> str:
    from gpupool.contain import hub_key as key

    return key(settings(config).db_url)


def cgroups(config: Config | None = None):
    """The process-wide cgroups of this hub's instance (gpupool.contain), made on first use after
    the start-up check of the database's instance (gpupool.instance; LostState when it fails)."""
    global _cgroups
    if _cgroups is None:
        import os

        from gpupool.contain import Containment, WorkloadCgroups, detect
        from gpupool.instance import settle

        opts = Containment(config=config or Config())
        tree = detect(opts.mode, hub_key(config))
        store = pool(config).store
        instance = settle(
            store,
            tree,
            hub_key(config),
            where=db_where(settings(config).db_url),
            state_hint=os.environ.get("GPUPOOL_STATE_DIR", ""),
        )
        _cgroups = WorkloadCgroups(tree, instance, hub_key(config), opts.stop_timeout_s)
    return _cgroups


def db_where(db_url: str) -> str:
    """Where the database is, for messages (a path, or a server without its credentials)."""
    return db_url.removeprefix("sqlite:///") if db_url.startswith("sqlite:///") else db_url.split("@")[-1]


def close() -> None:
    """Close the database (a hub that refuses to start leaves it as it found it)."""
    if _pool is not None:
        _pool.store.engine.dispose()
