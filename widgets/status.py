"""WorkspaceStatus: what GPU share this workspace holds, and the user's quota."""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from html import escape
from typing import Any
from urllib.parse import quote

import ipywidgets as w

from .client import Client, GPUPoolError


def _gpus(milli: int) -> str:
    text = f"{milli / 1000:.3f}".rstrip("0").rstrip(".")
    return f"{text} GPU" if milli <= 1000 else f"{text} GPUs"


def culler_rows(culler: Mapping[str, Any] | None, owner: str, server: str, now: float) -> list[tuple[str, str]]:
    """What the idle culler last found about this workspace."""
    if not culler:
        return []
    mine = [w for w in culler.get("workspaces", []) if w["owner"] == owner and w["name"] == server]
    if not mine:
        return []
    w = mine[0]
    rows = []
    if w.get("gpu_util_pct") is not None:
        rows.append(("GPU use", f"{w['gpu_util_pct']:.0f} % now, {w['memory_mib']:,} of {w['memory_limit_mib']:,} MiB"))
    if w.get("gpu_idle_s") is not None:
        rows.append(("GPU idle", f"{int(w['gpu_idle_s'] // 60)} min"))
    if w.get("cull_at"):
        left = max(0, int((w["cull_at"] - now) // 60))
        rows.append(("Session ends", f"in {left // 60} h {left % 60} min ({w['reason']})"))
    if w.get("action") in ("warn", "resolve-memory"):
        rows.append(("Warning", w["message"]))
    return rows


def parking_rows(parking: Mapping[str, Any] | None) -> list[tuple[str, str]]:
    """The parked line: the GPU went back to the pool and returns at the next cell."""
    if not parking or parking.get("state") not in ("parked", "waiting", "resuming", "failed"):
        return []
    return [("GPU parked", parking.get("message") or "GPU parked — it comes back when you run a cell")]


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
        self.extend_button = w.Button(description="Extend session", icon="clock-o",
                                      tooltip="Ask the idle culler for more time (once per session)")
        self.extend_button.on_click(lambda _: self.extend())
        self.resume_button = w.Button(description="Resume GPU", icon="play", tooltip="Ask for the parked GPU back",
                                      layout=w.Layout(display="none"))
        self.resume_button.on_click(lambda _: self.resume())
        super().__init__([w.HTML("<b>gpupool workspace</b>"), self.table, self.message,
                          w.HBox([self.refresh_button, self.extend_button, self.resume_button])], **kwargs)
        self.refresh()

    def extend(self) -> None:
        self.extend_button.disabled = True
        try:
            (self.client or Client()).post("api/culler/extend",
                                           {"server": os.environ.get("JUPYTERHUB_SERVER_NAME", "")})
        except GPUPoolError as err:
            self.message.value = f"<span style='color:#b00'>{escape(str(err))}</span>"
            return
        self.refresh()
        self.message.value = "Extended: the culler gives this session more time once."

    def resume(self) -> None:
        """The Resume button: the same claim the kernel's pre-run hook makes."""
        try:
            state = (self.client or Client()).post("api/parking/resume",
                                                   {"server": os.environ.get("JUPYTERHUB_SERVER_NAME", "")})
        except GPUPoolError as err:
            self.message.value = f"<span style='color:#b00'>{escape(str(err))}</span>"
            return
        self.refresh()
        self.message.value = escape(state.get("message", ""))

    def refresh(self) -> None:
        self.refresh_button.disabled = True
        self.message.value = "<i>reading the pool…</i>"
        try:
            client = self.client or Client()
            server = os.environ.get("JUPYTERHUB_SERVER_NAME", "")
            me = client.get("api/me")
            rows = status_rows(me, client.get("api/pool"), os.environ, server)
            try:
                rows += culler_rows(client.get("api/culler/status"), me["name"], server, time.time())
            except GPUPoolError:
                pass  # no culler findings yet: the share itself is still worth showing
            try:
                parked = parking_rows(client.get(f"api/parking/status?server={quote(server)}"))
            except GPUPoolError:
                parked = []  # a hub without parking
            rows = parked + rows
            self.resume_button.layout.display = "" if parked else "none"
        except GPUPoolError as err:
            self.message.value = f"<span style='color:#b00'>{escape(str(err))}</span>"
        else:
            self.table.value = "<table>" + "".join(
                f"<tr><td style='padding-right:1em'>{escape(k)}</td><td>{escape(v)}</td></tr>" for k, v in rows
            ) + "</table>"
            self.message.value = ""
        finally:
            self.refresh_button.disabled = False
