"""Allocation against utilization over time (the admin page's plot), and the service's own
address, which sends each caller on to the hub page that shows their part."""

from __future__ import annotations

import time
from collections import deque

from tornado import web

from gpupool.api.auth import BaseHandler
from gpupool.hub.templating import render
from gpupool.vocab.culler_wire import Finding
from gpupool.vocab.kinds import WorkloadKind

HISTORY_POINTS = 2880  # a day at one point every 30 s


class History:
    """Allocated and used GPUs over time, sampled on every culler pass (in memory)."""

    def __init__(self, maxlen: int = HISTORY_POINTS) -> None:
        self.points: deque[tuple[float, float, float | None]] = deque(maxlen=maxlen)

    def add(self, t: float, allocated_gpus: float, used_gpus: float | None) -> None:
        self.points.append((t, allocated_gpus, used_gpus))


def clock(t: float, span: float) -> str:
    return time.strftime("%H:%M:%S" if span < 600 else "%H:%M", time.localtime(t))


def svg_plot(
    points: list[tuple[float, float, float | None]], capacity: float, width: int = 720, height: int = 220
) -> str:
    """Allocation (blue) and utilization (orange) in GPUs over time, as an inline SVG
    (templates/gpupool-plot.html draws it)."""
    pad = 40
    if len(points) < 2 or capacity <= 0:
        return render("gpupool-plot.html", allocated="")
    t0, t1 = points[0][0], points[-1][0]
    span = max(t1 - t0, 1.0)

    def xy(t: float, v: float) -> str:
        x = pad + (t - t0) / span * (width - 2 * pad)
        y = height - pad - v / capacity * (height - 2 * pad)
        return f"{x:.1f},{y:.1f}"

    return render(
        "gpupool-plot.html",
        width=width,
        height=height,
        pad=pad,
        allocated=" ".join(xy(t, a) for t, a, _ in points),
        used=" ".join(xy(t, u) for t, _, u in points if u is not None),
        y_ticks=[
            (f"{height - pad - f * (height - 2 * pad) + 4:.0f}", f"{capacity * f:g}") for f in (0, 0.5, 1)
        ],
        x_ticks=[
            (f"{pad + f * (width - 2 * pad):.1f}", clock(t0 + f * span, span))
            for f in (0, 0.25, 0.5, 0.75, 1)
        ],
        window=f"{span / 60:.0f} min" if span >= 120 else f"{span:.0f} s",
    )


class StatusPage(BaseHandler):
    """The service's own address (the hub's Services menu links here): admins go on to the GPU
    pool page the hub serves in its own look, users to the hub's home page, where each of their
    servers shows its GPU share and time left."""

    @web.authenticated
    def get(self) -> None:
        hub = self.hub_auth.hub_prefix
        self.redirect(f"{hub}gpupool" if self.caller.admin else f"{hub}home")


def record_history(history: History, pool, workspaces: list[Finding], now: float | None = None) -> None:
    """Called on each culler report: total allocated GPUs, and GPUs used where measured."""
    allocated = pool.state.used_milli() / 1000
    measured = [w for w in workspaces if w.get("gpu_util_pct") is not None and w.get("gpu_data")]
    used = None
    if measured:
        shares = {(r.owner, r.name): r.total_milli for r in pool.store.allocations(kind=WorkloadKind.BUILD)}
        # SM utilization is a share of a whole GPU; a multi-GPU workspace reports its busiest GPU
        used = sum(
            (w["gpu_util_pct"] or 0.0) / 100 * max(1.0, shares.get((w["owner"], w["name"]), 0) / 1000)
            for w in measured
        )
    history.add(now if now is not None else time.time(), allocated, used)
