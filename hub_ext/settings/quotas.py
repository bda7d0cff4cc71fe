"""The build quotas in force: the config file's, with the changes admins stored through the API
over them, and the node pools they name checked against c.TrainPool.node_pools (read by the
caller, gpupool.wiring.root.node_pools: the settings do not import the training pool)."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING

from traitlets import TraitError

from gpupool.settings.config import GPUPool, policy_from_document, quota_document
from gpupool.vocab.kinds import EventKind

if TYPE_CHECKING:
    from gpupool.pool import BuildQuotaPolicy
    from gpupool.pool.pools import NodePool
    from gpupool.store import Store

log = logging.getLogger("gpupool")
QUOTAS_SETTING = "quotas"  # the stored setting that holds the API's quota changes


def stored_quotas(
    cfg: GPUPool, store: Store, pools: Mapping[str, NodePool]
) -> tuple[BuildQuotaPolicy, dict[str, str]]:
    """The build quotas in force: the config file's with the API's stored changes over them. Stored
    changes that no longer validate (a node pool since removed from `pools`, c.TrainPool.node_pools)
    are reported and skipped, never taking the hub down: (policy, {setting: why skipped})."""
    changed = store.get_setting(QUOTAS_SETTING)
    if not changed:
        return cfg.quota_policy(), {}
    try:
        quotas = policy_from_document({**quota_document(cfg), **changed})
        checked_pools(pools, quotas)
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


def checked_pools(pools: Mapping[str, NodePool], quotas: BuildQuotaPolicy) -> dict[str, NodePool]:
    """`pools` (c.TrainPool.node_pools: one definition for train jobs and build workspaces),
    checked against the pools the build quotas name."""
    for group, limits in [("build_pools", quotas.default), *quotas.group_overrides.items()]:
        unknown = set(limits.pools) - set(pools)
        if unknown:
            where = "GPUPool.build_pools" if group == "build_pools" else f"GPUPool.group_overrides[{group!r}]"
            raise TraitError(
                f"{where}: pools {sorted(unknown)} are not in TrainPool.node_pools ({sorted(pools)})"
            )
    return dict(pools)
