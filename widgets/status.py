"""WorkspaceStatus (`%gpupool`): this workspace's GPU share, its use, when and why it stops, the
user's quota and training projects — read again by itself."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Mapping
from html import escape
from typing import Any
from urllib.parse import quote

import ipywidgets as w

from gpupool.vocab.culler_wire import CullerStatus
from gpupool.vocab.culling import CullAction, CullReason
from gpupool.vocab.hibernate_wire import HibernatedList
from gpupool.vocab.pool_wire import GPUView, MeView, PoolView
from gpupool.vocab.reason_words import UPCOMING
from gpupool.widgets.client import Client, GPUPoolError
from gpupool.widgets.summary import (
    clock,
    culler_finding,
    gpus_text,
    last_move,
    left_text,
    my_shares,
    parked_milli,
)


def _gpus(milli: int) -> str:
    return gpus_text(milli)


def culler_rows(
    culler: CullerStatus | None, owner: str, server: str, now: float, virtual: bool = False
) -> list[tuple[str, str]]:
    """What the idle culler last found about this workspace, in plain words."""
    found = culler_finding(culler, owner, server)
    rows = []
    if found.get("gpu_util_pct") is not None:
        rows.append(
            (
                "GPU use",
                f"{found['gpu_util_pct']:.0f} % now, {found.get('memory_mib', 0):,} of"
                f" {found.get('memory_limit_mib', 0):,} MiB",
            )
        )
    else:
        rows.append(("GPU use", "no GPU data: virtual GPU" if virtual else "no GPU data yet"))
    if found.get("gpu_idle_s") is not None:
        rows.append(("GPU idle", left_text(found["gpu_idle_s"])))
    if found.get("extended") and not found.get("cull_at"):
        rows.append(("Session", "extended once: the new end time comes with the idle culler's next pass"))
    elif found.get("cull_at"):
        why = UPCOMING.get(found.get("reason", ""), "")
        rows.append(
            (
                "Session",
                f"stops at {clock(found['cull_at'])} (in {left_text(found['cull_at'] - now)})"
                + (f" {why}" if why else ""),
            )
        )
    if found.get("action") in (CullAction.WARN, CullAction.RESOLVE_MEMORY):
        rows.append(("Warning", found.get("message", "")))
    return rows


def gpu_name(gpu: GPUView) -> str:
    return f"virtual GPU #{gpu['index']}" if gpu.get("virtual") else f"{gpu['model']} #{gpu['index']}"


def parking_rows(parking: Mapping[str, Any] | None) -> list[tuple[str, str]]:
    """The parked line: the GPU went back to the pool and returns at the next cell."""
    if not parking or parking.get("state") not in ("parked", "waiting", "resuming", "failed"):
        return []
    return [("GPU parked", parking.get("message") or "GPU parked — it comes back when you run a cell")]


def hibernated_rows(answer: HibernatedList | None, server: str) -> list[tuple[str, str]]:
    """The user's hibernated servers (gpupool.api.hibernation): when, and that the variables come
    back at the next start; retention's warning before their state is deleted."""
    rows: list[tuple[str, str]] = []
    for r in answer.get("hibernated") or [] if answer else []:
        name = str(r.get("name", ""))
        label = "Hibernated" if name == server else f"Hibernated: {name or 'default server'}"
        rows.append((label, str(r.get("message", ""))))
    for warning in answer.get("warnings") or [] if answer else []:
        name = str(warning.get("name", ""))
        label = "Deleted soon" if name == server else f"Deleted soon: {name or 'default server'}"
        rows.append((label, str(warning.get("message", ""))))
    return rows


def status_rows(
    me: MeView, pool: PoolView, env: Mapping[str, str], server: str = ""
) -> list[tuple[str, str]]:
    """Label/value rows for this workspace: pure, so the widget and its tests agree."""
    mine = my_shares(pool, me["name"], server)
    rows: list[tuple[str, str]] = []
    if not mine:
        rows.append(("GPU", "none: this workspace runs without a GPU share"))
    for gpu, share in mine:
        memory = gpu["memory_mib"] * share["milli"] // 1000
        rows.append(("GPU", f"{gpu_name(gpu)} on {gpu['node']}"))
        rows.append(("Share", f"{_gpus(share['milli'])} = {memory:,} MiB of {gpu['memory_mib']:,} MiB"))
    held = sum(h["milli"] for h in me.get("holdings", []))  # parked shares count, as the quota counts them
    parked = parked_milli(me, server)
    if parked and not mine:
        rows = [("Share", f"{_gpus(parked)}, parked: it comes back when you run a cell")]
    others = [h for h in me.get("holdings", []) if h["server"] != server]
    quota = f"{_gpus(held)} of {_gpus(me['build_quota_milli'])} in use"
    if others:
        quota += (
            " (also: "
            + ", ".join(
                f"{h['server'] or 'default'} {_gpus(h['milli'])}" + (" parked" if h.get("parked") else "")
                for h in others
            )
            + ")"
        )
    moved, _ = last_move(mine)
    if moved:
        rows.append(("Moved", f"{moved}: nothing restarted"))
    rows.append(("Build quota", quota))
    if env.get("CUDA_VISIBLE_DEVICES") is not None and mine:
        rows.append(("CUDA_VISIBLE_DEVICES", env["CUDA_VISIBLE_DEVICES"]))
    return rows


def budget_rows(budget: Mapping[str, Any] | None) -> list[tuple[str, str]]:
    """The GPU-hour budget (api/budget): how much is used, a warning near or over it, and a
    smaller size when the last sessions used far less than their share."""
    if not budget:
        return []
    rows = []
    if budget.get("status") not in (None, "none"):
        head = {"over": "USED UP: ", "near": "nearly used: "}.get(budget["status"], "")
        rows.append(("GPU-hour budget", head + budget.get("message", "")))
    advice = budget.get("rightsizing")
    if advice:
        rows.append(("Smaller size", f"{advice['suggested_gpus']:g} GPU would do: {advice['message']}"))
    return rows


def project_rows(projects: Mapping[str, Any] | None) -> list[tuple[str, str]]:
    """The training projects this user may submit to (%%train --project NAME)."""
    items = (projects or {}).get("projects", [])
    if not items:
        return []
    text = "; ".join(
        f"{p['name']} ({_gpus(p['guarantee_milli'])} guaranteed, {_gpus(p['used_milli'])} in use)"
        for p in items
    )
    return [("Train projects", text)]


def workspace_view(client: Client, server: str, env: Mapping[str, str], now: float) -> dict[str, Any]:
    """Everything `%gpupool` shows of this workspace: label/value rows, whether Extend may be
    pressed and whether the GPU is parked (Resume). GPUPoolError when the API does not answer."""
    me = client.get("api/me")
    pool = client.get("api/pool")
    rows = status_rows(me, pool, env, server)
    virtual = any(gpu.get("virtual") for gpu, _ in my_shares(pool, me["name"], server))
    try:
        culler = client.get("api/culler/status")
    except GPUPoolError:
        culler = None  # no culler findings yet: the share itself is still worth showing
    rows += culler_rows(culler, me["name"], server, now, virtual)
    try:
        rows += budget_rows(client.get("api/budget"))
    except GPUPoolError:
        pass  # a hub without usage accounting
    try:
        rows += project_rows(client.get("api/projects"))
    except GPUPoolError:
        pass  # no training pool on this hub
    try:
        parked = parking_rows(client.get(f"api/parking/status?server={quote(server)}"))
    except GPUPoolError:
        parked = []  # a hub without parking
    try:
        rows += hibernated_rows(client.get("api/hibernated"), server)
    except GPUPoolError:
        pass  # a hub without hibernation records
    try:  # the culling demo (gpupool up --demo-culling): GPU use is what the user says
        said = client.get("api/demo/gpu-use").get("use", {}).get(f"{me['name']}/{server}", "idle")
        rows.append(
            ("Demo GPU use", f"{said} (simulated; say %gpupool gpu {'idle' if said == 'busy' else 'busy'})")
        )
    except GPUPoolError:
        pass  # not the demo
    found = culler_finding(culler, me["name"], server)
    holds = bool(parked) or bool(my_shares(pool, me["name"], server))
    if parked:  # not "none: this workspace runs without a GPU share": its GPU comes back on use
        rows = [r for r in rows if r[0] != "GPU" or not r[1].startswith("none:")]
    return {
        "rows": parked + rows,
        "parked": bool(parked),
        "extendable": holds and not found.get("extended") and found.get("reason") != CullReason.MEMORY,
    }


def rows_html(rows: list[tuple[str, str]] | list[list[str]]) -> str:
    return (
        "<table>"
        + "".join(
            f"<tr><td style='padding-right:1em;vertical-align:top'>{escape(k)}</td><td>{escape(v)}</td></tr>"
            for k, v in rows
        )
        + "</table>"
    )


# %gpupool's output: JupyterLab's gpupool extension renders this type as a live view that reads
# the server's own endpoint while the tab is visible (no kernel traffic, so no user activity);
# other front ends show the HTML snapshot
MIME_TYPE = "application/vnd.gpupool.workspace+json"


def live_view(client: Client | None = None, env: Mapping[str, str] | None = None) -> dict[str, object]:
    """The display bundle `%gpupool` shows."""
    env = os.environ if env is None else env
    server = env.get("JUPYTERHUB_SERVER_NAME", "")
    try:
        view = workspace_view(client or Client(), server, env, time.time())
        html = f"<b>gpupool workspace</b>{rows_html(view['rows'])}"
        text = "\n".join(f"{k}: {v}" for k, v in view["rows"])
    except GPUPoolError as err:
        view, html, text = (
            {"rows": [], "error": str(err)},
            f"<span style='color:#b00'>{escape(str(err))}</span>",
            str(err),
        )
    return {MIME_TYPE: {"server": server, **view}, "text/html": html, "text/plain": text}


class WorkspaceStatus(w.VBox):
    """The GPU share of this workspace, its use and when it stops, as an ipywidget for code of
    your own; it reads the API again every `interval` seconds by itself (a thread, stopped when
    the widget is closed), and those refreshes are not user activity (gpupool.widgets.quiet).
    `%gpupool` shows the same rows as a view the browser refreshes."""

    def __init__(
        self, client: Client | None = None, follow: bool = True, interval: float = 30.0, **kwargs: object
    ) -> None:
        self.client, self.interval = client, interval
        self.table = w.HTML()
        self.message = w.HTML()
        self.extend_button = w.Button(
            description="Extend session",
            icon="clock-o",
            layout=w.Layout(width="auto"),
            tooltip="Ask the idle culler for more time (once per session)",
        )
        self.extend_button.on_click(lambda _: self.extend())
        self.resume_button = w.Button(
            description="Resume GPU",
            icon="play",
            tooltip="Ask for the parked GPU back",
            layout=w.Layout(display="none"),
        )
        self.resume_button.on_click(lambda _: self.resume())
        self._stop = threading.Event()
        super().__init__(
            [
                w.HTML("<b>gpupool workspace</b>"),
                self.table,
                self.message,
                w.HBox([self.extend_button, self.resume_button]),
            ],
            **kwargs,
        )
        self.refresh()
        if follow:
            threading.Thread(target=self._follow, name="gpupool-status", daemon=True).start()

    def _follow(self) -> None:
        from gpupool.widgets.quiet import background

        with background():  # what this thread sends is not user activity
            while not self._stop.wait(self.interval):
                self.refresh(quiet=True)

    def close(self) -> None:
        self._stop.set()
        super().close()

    def extend(self) -> None:
        self.extend_button.disabled = True
        try:
            (self.client or Client()).post(
                "api/culler/extend", {"server": os.environ.get("JUPYTERHUB_SERVER_NAME", "")}
            )
        except GPUPoolError as err:
            self.message.value = f"<span style='color:#b00'>{escape(str(err))}</span>"
            return
        self.refresh()
        self.message.value = "Extended: the idle culler gives this session more time once."

    def resume(self) -> None:
        """The Resume button: the same claim the kernel's pre-run hook makes."""
        try:
            state = (self.client or Client()).post(
                "api/parking/resume", {"server": os.environ.get("JUPYTERHUB_SERVER_NAME", "")}
            )
        except GPUPoolError as err:
            self.message.value = f"<span style='color:#b00'>{escape(str(err))}</span>"
            return
        self.refresh()
        self.message.value = escape(state.get("message", ""))

    def refresh(self, quiet: bool = False) -> None:
        if not quiet:
            self.message.value = "<i>reading the pool…</i>"
        try:
            view = workspace_view(
                self.client or Client(), os.environ.get("JUPYTERHUB_SERVER_NAME", ""), os.environ, time.time()
            )
        except GPUPoolError as err:
            self.message.value = f"<span style='color:#b00'>{escape(str(err))}</span>"
            self.extend_button.disabled = True  # nothing to extend that the hub cannot read
            return
        self.resume_button.layout.display = "" if view["parked"] else "none"
        self.table.value = rows_html(view["rows"])
        self.extend_button.disabled = not view["extendable"]
        if not quiet:
            self.message.value = ""
