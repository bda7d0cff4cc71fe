"""Admins read and change build quotas at run time: validated like the config file,
applied to the next spawn without a restart, kept across restarts.

Running workspaces keep their shares: a fixed quota is never taken back.
"""

from __future__ import annotations

from tornado import web
from traitlets import TraitError

from .. import runtime
from ..config import policy_from_document, quota_document
from .auth import APIHandler


class QuotasHandler(APIHandler):
    def admin_only(self) -> None:
        if not self.caller.admin:
            raise web.HTTPError(403, "only admins may read or change quotas; see your own in api/me")

    def current(self) -> dict:
        base = quota_document(runtime.settings())
        changed = self.pool.store.get_setting(runtime.QUOTAS_SETTING) or {}
        return {**base, **changed}

    @web.authenticated
    def get(self) -> None:
        self.admin_only()
        changed = self.pool.store.get_setting(runtime.QUOTAS_SETTING) or {}
        self.write_json({"quotas": self.current(), "changed_through_api": sorted(changed)})

    @web.authenticated
    def put(self) -> None:
        """Change some quota options; the body holds only the keys to change."""
        self.admin_only()
        body = self.json_body()
        changed = {**(self.pool.store.get_setting(runtime.QUOTAS_SETTING) or {}), **body}
        try:
            policy = policy_from_document({**quota_document(runtime.settings()), **changed})
        except (TraitError, ValueError) as err:
            raise web.HTTPError(400, str(err)) from None
        self.pool.store.put_setting(runtime.QUOTAS_SETTING, changed)
        self.pool.quotas = policy
        self.pool.store.record("quota", f"{self.caller.name} changed {sorted(body)}", owner=self.caller.name,
                               changes=body)
        self.write_json({"quotas": self.current(), "changed_through_api": sorted(changed)})

    @web.authenticated
    def delete(self) -> None:
        """Forget API changes: back to the config file's quotas."""
        self.admin_only()
        self.pool.store.delete_setting(runtime.QUOTAS_SETTING)
        self.pool.quotas = runtime.settings().quota_policy()
        self.pool.store.record("quota", f"{self.caller.name} reset quotas to the config",
                               owner=self.caller.name)
        self.write_json({"quotas": self.current(), "changed_through_api": []})
