"""Admins read and change build quotas at run time: validated like the config file,
applied to the next spawn without a restart, kept across restarts.

Running workspaces keep their shares: a fixed quota is never taken back.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from tornado import web
from traitlets import TraitError

from gpupool.api.auth import APIHandler
from gpupool.pool.units import UnitError, parse_gpus, shown
from gpupool.settings.config import GROUP_NAME, policy_from_document, quota_document, quota_notes
from gpupool.settings.quotas import QUOTAS_SETTING, checked_pools
from gpupool.train.config import TrainPool
from gpupool.vocab.kinds import EventKind

if TYPE_CHECKING:
    from gpupool.alloc.manager import PoolManager
    from gpupool.api.auth import ApiRoot

MAX_GROUP_CHARS = 255  # JupyterHub's own limit on a group name


class QuotaRefused(ValueError):
    """A quota change that is not stored, with the reason to show."""


def current_quotas(root: ApiRoot) -> dict[str, Any]:
    """The quota options in force: the config file's, with the API's changes over them (unless those
    were skipped at start because they no longer validate)."""
    pool = root.pool
    if QUOTAS_SETTING in pool.skipped_settings:
        return quota_document(root.settings)
    changed = pool.store.get_setting(QUOTAS_SETTING) or {}
    return {**quota_document(root.settings), **changed}


def change_quotas(root: ApiRoot, who: str, body: dict[str, object], what: str = "") -> dict[str, object]:
    """Change some quota options (`body` holds only the keys to change): validated exactly as
    the config file is, stored and applied to the next spawn; nothing is stored on a bad value.
    The API and the hub's GPU pool page both change quotas through here."""
    pool = root.pool
    stored = {} if QUOTAS_SETTING in pool.skipped_settings else pool.store.get_setting(QUOTAS_SETTING)
    changed = {**(stored or {}), **body}
    try:
        policy = policy_from_document({**quota_document(root.settings), **changed})
        # the node pools named must exist now (and a restart re-checks them: quota_settings.stored_quotas)
        checked_pools(TrainPool(config=root.config).pool_table(), policy)
    except (TraitError, ValueError) as err:
        raise QuotaRefused(str(err)) from None
    pool.store.put_setting(QUOTAS_SETTING, changed)
    pool.quotas = policy
    pool.skipped_settings.pop(QUOTAS_SETTING, None)
    pool.store.record(EventKind.QUOTA, f"{who} {what or f'changed {sorted(body)}'}", owner=who, changes=body)
    return changed


def notes(pool: PoolManager) -> list[str]:
    """What the quotas now in force shut out, said back to whoever changed them."""
    return quota_notes(pool.quotas)


def checked_group(group: object) -> str:
    if not isinstance(group, str) or not GROUP_NAME.match(group):
        raise QuotaRefused(
            f"a group name is 1 to {MAX_GROUP_CHARS} letters, digits or . _ @ + : / -, starting"
            f" with a letter or digit (no spaces); {shown(group)} is not one"
        )
    return group


def gpus_amount(value: object, what: str) -> int | float:
    """An amount typed by an admin ("0.5", 2), in GPUs as the config file keeps them; refused
    in plain words ("0.3x" is not an amount of GPUs), not with a traitlets message."""
    try:
        milli = parse_gpus(value)
    except UnitError:
        raise QuotaRefused(
            f"{what} must be an amount of GPUs such as 0.25, 1 or 2; {shown(value)} is not one"
        ) from None
    if milli < 0:
        raise QuotaRefused(f"{what} cannot be negative; got {shown(value)}")
    return milli // 1000 if milli % 1000 == 0 else milli / 1000


def group_quota_change(root: ApiRoot, group: object, quota: object) -> dict[str, object]:
    """The `group_overrides` change that sets one group's build quota (in GPUs), keeping its
    other limits. A group without an override gets one holding only its quota."""
    group = checked_group(group)
    gpus = gpus_amount(quota, f"the build quota of group {group!r}")
    overrides = dict(current_quotas(root).get("group_overrides") or {})
    overrides[group] = {**(overrides.get(group) or {}), "quota": gpus}
    return {"group_overrides": overrides}


def group_total_change(root: ApiRoot, group: object, total: object) -> dict[str, object]:
    """The `group_totals` change that sets what one group's members hold together (a class's
    GPUs); an empty total takes the ceiling away."""
    group = checked_group(group)
    totals = dict(current_quotas(root).get("group_totals") or {})
    if total in ("", None):
        totals.pop(group, None)
    else:
        totals[group] = gpus_amount(total, f"the total of group {group!r}")
    return {"group_totals": totals}


def group_removal(root: ApiRoot, group: object) -> dict[str, object]:
    """The change that forgets a group's own quota and total: its members get the defaults."""
    group = checked_group(group)
    quotas = current_quotas(root)
    overrides = {g: v for g, v in (quotas.get("group_overrides") or {}).items() if g != group}
    totals = {g: v for g, v in (quotas.get("group_totals") or {}).items() if g != group}
    return {"group_overrides": overrides, "group_totals": totals}


class QuotasHandler(APIHandler):
    def admin_only(self) -> None:
        if not self.caller.admin:
            raise web.HTTPError(403, "only admins may read or change quotas; see your own in api/me")

    @web.authenticated
    def get(self) -> None:
        self.admin_only()
        changed = self.pool.store.get_setting(QUOTAS_SETTING) or {}
        skipped = self.pool.skipped_settings.get(QUOTAS_SETTING, "")
        self.write_json(
            {
                "quotas": current_quotas(self.root),
                "changed_through_api": [] if skipped else sorted(changed),
                **({"skipped": skipped} if skipped else {}),
            }
        )

    @web.authenticated
    def put(self) -> None:
        """Change some quota options; the body holds only the keys to change."""
        self.admin_only()
        try:
            changed = change_quotas(self.root, self.caller.name, self.json_body())
        except QuotaRefused as err:
            raise web.HTTPError(400, str(err)) from None
        self.write_json(
            {
                "quotas": current_quotas(self.root),
                "changed_through_api": sorted(changed),
                "notes": notes(self.pool),
            }
        )

    @web.authenticated
    def delete(self) -> None:
        """Forget API changes: back to the config file's quotas."""
        self.admin_only()
        self.pool.store.delete_setting(QUOTAS_SETTING)
        self.pool.skipped_settings.pop(QUOTAS_SETTING, None)
        self.pool.quotas = self.root.settings.quota_policy()
        self.pool.store.record(
            EventKind.QUOTA, f"{self.caller.name} reset quotas to the config", owner=self.caller.name
        )
        self.write_json({"quotas": current_quotas(self.root), "changed_through_api": []})
