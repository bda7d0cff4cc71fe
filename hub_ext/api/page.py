"""The gpupool page: GPU occupancy, utilization against allocation over time, projects, and
recent culls and preemptions. Admins see everyone; users see their own part."""

from __future__ import annotations

import time
from collections import deque
from html import escape

from tornado import web

from ..pool import format_gpus
from .auth import BaseHandler
from .pool import gpu_table

HISTORY_POINTS = 2880  # a day at one point every 30 s


class History:
    """Allocated and used GPUs over time, sampled on every culler pass (in memory)."""

    def __init__(self, maxlen: int = HISTORY_POINTS) -> None:
        self.points: deque[tuple[float, float, float | None]] = deque(maxlen=maxlen)

    def add(self, t: float, allocated_gpus: float, used_gpus: float | None) -> None:
        self.points.append((t, allocated_gpus, used_gpus))


def svg_plot(points: list[tuple[float, float, float | None]], capacity: float, width: int = 720,
             height: int = 220) -> str:
    """Allocation (blue) and utilization (orange) in GPUs over time, as an inline SVG."""
    pad = 40
    if len(points) < 2 or capacity <= 0:
        return "<p class='gpupool-noplot'>Not enough samples yet: the plot fills in as the culler runs.</p>"
    t0, t1 = points[0][0], points[-1][0]
    span = max(t1 - t0, 1.0)

    def xy(t: float, v: float) -> str:
        x = pad + (t - t0) / span * (width - 2 * pad)
        y = height - pad - v / capacity * (height - 2 * pad)
        return f"{x:.1f},{y:.1f}"

    alloc = " ".join(xy(t, a) for t, a, _ in points)
    used_pts = [(t, u) for t, _, u in points if u is not None]
    used = " ".join(xy(t, u) for t, u in used_pts)
    ticks = "".join(
        f"<text x='{pad - 6}' y='{height - pad - f * (height - 2 * pad) + 4:.0f}' text-anchor='end'"
        f" font-size='11'>{capacity * f:g}</text>" for f in (0, 0.5, 1)
    )
    window = f"{span / 60:.0f} min" if span >= 120 else f"{span:.0f} s"
    used_line = (f"<polyline class='used' fill='none' stroke='#e6550d' stroke-width='2' points='{used}'/>"
                 if used_pts else "")
    note = "" if used_pts else (f"<text x='{width / 2}' y='{pad - 10}' text-anchor='middle' font-size='12'>"
                                "no GPU utilization data (virtual GPUs or no NVML)</text>")
    return (
        f"<svg class='gpupool-plot' width='{width}' height='{height}' role='img'"
        f" aria-label='GPUs allocated and used over time'>"
        f"<rect x='{pad}' y='{pad}' width='{width - 2 * pad}' height='{height - 2 * pad}' fill='#f7f7f7'/>"
        f"{ticks}<text x='{width - pad}' y='{height - 10}' text-anchor='end' font-size='11'>last"
        f" {window}</text>"
        f"<polyline class='allocated' fill='none' stroke='#3182bd' stroke-width='2' points='{alloc}'/>"
        f"{used_line}{note}</svg>"
        "<p><span style='color:#3182bd'>■ allocated</span> <span style='color:#e6550d'>■ used</span>"
        " (GPUs)</p>"
    )


class StatusPage(BaseHandler):
    @web.authenticated
    def get(self) -> None:
        caller = self.caller
        pool = self.pool
        rows = []
        for gpu in gpu_table(pool, caller):
            holders = ", ".join(
                f"{escape(s['owner'])}{'/' + escape(s['name']) if s['name'] else ''}"
                f" ({format_gpus(s['milli'])}, {s['kind']})"
                for s in gpu["shares"]
            ) or "—"
            used = 1000 - gpu["free_milli"]
            virtual = " <i>(virtual)</i>" if gpu["virtual"] else ""
            rows.append(
                f"<tr><td>{escape(gpu['node'])}</td><td>{gpu['index']}</td>"
                f"<td>{escape(gpu['model'])}{virtual}</td>"
                f"<td><meter min=0 max=1000 value={used}></meter> {used / 10:.0f}%</td>"
                f"<td>{holders}</td></tr>"
            )
        history: History = self.settings.setdefault("history", History())
        plot = svg_plot(list(history.points), pool.inventory.gpu_count)
        self.finish(
            "<!doctype html><html><head><title>gpupool</title>"
            "<style>body{font-family:sans-serif;margin:2em}td,th{padding:4px 10px;text-align:left}"
            "h2{margin-top:1.5em}</style>"
            f"</head><body><h1>GPU pool</h1><p>Signed in as {escape(caller.name)}"
            f"{' (admin: you see everyone)' if caller.admin else ' (you see your own shares and jobs)'}."
            f" <a href='{escape(self.hub_auth.hub_prefix)}home'>Back to the hub</a></p>"
            "<h2>Occupancy</h2>"
            "<table class='gpupool-gpus'><tr><th>Node</th><th>GPU</th><th>Model</th><th>Allocated</th>"
            "<th>Held by</th></tr>" + "".join(rows) + "</table>"
            "<h2>Allocation is not utilization</h2>" + plot
            + self.projects_html() + self.events_html() + "</body></html>"
        )

    def projects_html(self) -> str:
        training = self.settings.get("training")
        if training is None:
            return ""
        jobs = training.jobs()
        rows = []
        for p in training.projects.values():
            used = sum(j.total_milli for j in jobs if j.project == p.name and j.state in ("running", "preempting"))
            queued = sum(1 for j in jobs if j.project == p.name and j.state == "queued")
            limit = "none" if p.limit_milli < 0 else format_gpus(p.limit_milli)
            rows.append(f"<tr><td>{escape(p.name)}</td><td>{escape(p.department)}</td>"
                        f"<td>{format_gpus(p.guarantee_milli)}</td><td>{limit}</td><td>{format_gpus(used)}</td>"
                        f"<td>{queued}</td></tr>")
        depts = []
        for d in training.departments.values():
            members = [p.name for p in training.projects.values() if p.department == d.name]
            used = sum(j.total_milli for j in jobs if j.project in members and j.state in ("running", "preempting"))
            limit = "none" if d.limit_milli < 0 else format_gpus(d.limit_milli)
            depts.append(f"<tr><td>{escape(d.name)}</td><td>{escape(', '.join(members))}</td>"
                         f"<td>{format_gpus(d.guarantee_milli)}</td><td>{limit}</td><td>{format_gpus(used)}</td></tr>")
        dept_table = ("<table class='gpupool-departments'><tr><th>Department</th><th>Projects</th><th>Guarantee</th>"
                      "<th>Limit</th><th>In use</th></tr>" + "".join(depts) + "</table>") if depts else ""
        return ("<h2>Training projects</h2><table class='gpupool-projects'><tr><th>Project</th>"
                "<th>Department</th><th>Guarantee</th><th>Limit</th><th>In use</th><th>Queued jobs</th></tr>"
                + "".join(rows) + "</table>" + dept_table)

    def events_html(self) -> str:
        caller = self.caller
        filters = {} if caller.admin else {"owner": caller.name}
        events = [e for e in self.pool.store.events(limit=300, **filters)
                  if e.kind in ("cull", "warn", "preempt", "requeue", "resume", "memory")][:30]
        items = "".join(f"<tr><td>{e.time:%Y-%m-%d %H:%M:%S}</td><td>{escape(e.kind)}</td>"
                        f"<td>{escape(e.message)}</td></tr>" for e in events) or "<tr><td>none yet</td></tr>"
        return f"<h2>Recent culls and preemptions</h2><table class='gpupool-events'>{items}</table>"


def record_history(settings: dict, pool, workspaces: list[dict], now: float | None = None) -> None:
    """Called on each culler report: total allocated GPUs, and GPUs used where measured."""
    history: History = settings.setdefault("history", History())
    allocated = pool.state.used_milli() / 1000
    measured = [w for w in workspaces if w.get("gpu_util_pct") is not None and w.get("gpu_data")]
    used = None
    if measured:
        shares = {(r.owner, r.name): r.total_milli for r in pool.store.allocations(kind="build")}
        # SM utilization is a share of a whole GPU; a multi-GPU workspace reports its busiest GPU
        used = sum(w["gpu_util_pct"] / 100 * max(1.0, shares.get((w["owner"], w["name"]), 0) / 1000)
                   for w in measured)
    history.add(now if now is not None else time.time(), allocated, used)
