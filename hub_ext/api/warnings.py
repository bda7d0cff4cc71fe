"""The culler's warnings for one user, for JupyterHub's home page (a template variable)."""

from __future__ import annotations

from typing import Any
from urllib.parse import quote

from .. import runtime
from .culler import culler_state


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
