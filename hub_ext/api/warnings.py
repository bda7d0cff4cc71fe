"""The culler's warnings and the GPU shares of one user, for JupyterHub's home page (template variables)."""

from __future__ import annotations

import time
from typing import Any
from urllib.parse import quote

from .. import runtime
from ..pool import format_gpus
from .culler import culler_state, findings


def warnings_for(user: Any, base_url: str = "") -> list[dict]:
    """The workspaces of `user` the culler's last pass warned about, with the link that
    extends one (when it may still be extended; memory warnings cannot be)."""
    if user is None or runtime.api_settings is None:
        return []
    out = []
    for w in culler_state(runtime.api_settings)["workspaces"].values():
        if w.get("owner") != user.name or w.get("action") != "warn":
            continue
        can_extend = not w.get("extended") and w.get("reason") != "memory"
        link = f"{base_url}/services/gpupool/culler/extend?server={quote(w.get('name', ''))}"
        out.append({**w, "extend_url": link if can_extend else ""})
    return sorted(out, key=lambda w: w.get("name", ""))


def shares_for(user: Any, now: float | None = None) -> list[dict]:
    """Each of `user`'s servers holding a GPU share, with when the culler last said it stops,
    for the hub's home page: [{"name", "share", "stops"}], sorted by server name."""
    if user is None or runtime.api_settings is None or "gpupool" not in runtime.api_settings:
        return []
    pool = runtime.api_settings["gpupool"]
    found = findings(runtime.api_settings, pool, runtime.api_settings["directory"].hub_app, user.name)
    now = time.time() if now is None else now
    out = []
    for row in pool.store.allocations(kind="build", owner=user.name):
        w = found.get(f"{user.name}/{row.name}") or {}
        stops = "no time limit"
        if w.get("cull_at"):
            left = max(0, int((w["cull_at"] - now) // 60))
            stops = f"stops at {time.strftime('%H:%M', time.localtime(w['cull_at']))}" \
                    f" (in {left // 60} h {left % 60} min)" if left >= 60 else \
                    f"stops at {time.strftime('%H:%M', time.localtime(w['cull_at']))} (in {left} min)"
        out.append({"name": row.name, "share": format_gpus(row.total_milli), "stops": stops})
    return sorted(out, key=lambda s: s["name"])
