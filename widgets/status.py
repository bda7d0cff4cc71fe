"""WorkspaceStatus: what GPU share this workspace holds, and the user's quota."""

from __future__ import annotations

import os
from collections.abc import Mapping
from html import escape
from typing import Any

import ipywidgets as w

from .client import Client, GPUPoolError


def _gpus(milli: int) -> str:
    text = f"{milli / 1000:.3f}".rstrip("0").rstrip(".")
    return f"{text} GPU" if milli <= 1000 else f"{text} GPUs"


def status_rows(me: Mapping[str, Any], pool: Mapping[str, Any], env: Mapping[str, str],
                server: str = "") -> list[tuple[str, str]]:
    """Label/value rows for this workspace: pure, so the widget and its tests agree."""
    mine = [
        (gpu, share) for gpu in pool.get("gpus", []) for share in gpu["shares"]
        if share["owner"] == me["name"] and share["name"] == server and share["kind"] == "build"
    ]
    rows: list[tuple[str, str]] = []
    if not mine:
        rows.append(("GPU", "none: this workspace runs without a GPU share"))
    for gpu, share in mine:
        virtual = " (virtual)" if gpu["virtual"] else ""
        memory = gpu["memory_mib"] * share["milli"] // 1000
        rows.append(("GPU", f"{gpu['model']}{virtual} #{gpu['index']} on {gpu['node']}"))
        rows.append(("Share", f"{_gpus(share['milli'])} = {memory:,} MiB of {gpu['memory_mib']:,} MiB"))
    held = sum(h["milli"] for h in me.get("holdings", []))
    others = [h for h in me.get("holdings", []) if h["server"] != server]
    quota = f"{_gpus(held)} of {_gpus(me['build_quota_milli'])} in use"
    if others:
        quota += " (also: " + ", ".join(f"{h['server'] or 'default'} {_gpus(h['milli'])}" for h in others) + ")"
    rows.append(("Build quota", quota))
    if env.get("CUDA_VISIBLE_DEVICES") is not None and mine:
        rows.append(("CUDA_VISIBLE_DEVICES", env["CUDA_VISIBLE_DEVICES"]))
    return rows


class WorkspaceStatus(w.VBox):
    """Shows the GPU share of this workspace; press Refresh (or call .refresh())."""

    def __init__(self, client: Client | None = None, **kwargs: Any) -> None:
        self.client = client
        self.table = w.HTML()
        self.message = w.HTML()
        self.refresh_button = w.Button(description="Refresh", icon="refresh", tooltip="Read the pool again")
        self.refresh_button.on_click(lambda _: self.refresh())
        super().__init__([w.HTML("<b>gpupool workspace</b>"), self.table, self.message,
                          self.refresh_button], **kwargs)
        self.refresh()

    def refresh(self) -> None:
        self.refresh_button.disabled = True
        self.message.value = "<i>reading the pool…</i>"
        try:
            client = self.client or Client()
            rows = status_rows(client.get("api/me"), client.get("api/pool"), os.environ,
                               os.environ.get("JUPYTERHUB_SERVER_NAME", ""))
        except GPUPoolError as err:
            self.message.value = f"<span style='color:#b00'>{escape(str(err))}</span>"
        else:
            self.table.value = "<table>" + "".join(
                f"<tr><td style='padding-right:1em'>{escape(k)}</td><td>{escape(v)}</td></tr>" for k, v in rows
            ) + "</table>"
            self.message.value = ""
        finally:
            self.refresh_button.disabled = False
