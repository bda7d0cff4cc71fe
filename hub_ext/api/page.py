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


def clock(t: float, span: float) -> str:
    return time.strftime("%H:%M:%S" if span < 600 else "%H:%M", time.localtime(t))


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
    ticks += "".join(  # the time axis: clock times under the plot
        f"<line x1='{pad + f * (width - 2 * pad):.1f}' x2='{pad + f * (width - 2 * pad):.1f}' y1='{height - pad}'"
        f" y2='{height - pad + 4}' stroke='#999'/><text class='time-tick' x='{pad + f * (width - 2 * pad):.1f}'"
        f" y='{height - pad + 16}' text-anchor='middle' font-size='11'>{clock(t0 + f * span, span)}</text>"
        for f in (0, 0.25, 0.5, 0.75, 1))
    used_line = (f"<polyline class='used' fill='none' stroke='#e6550d' stroke-width='2' points='{used}'/>"
                 if used_pts else "")
    note = "" if used_pts else (f"<text x='{width / 2}' y='{pad - 10}' text-anchor='middle' font-size='12'>"
                                "no GPU utilization data (virtual GPUs or no NVML)</text>")
    return (
        f"<svg class='gpupool-plot' width='{width}' height='{height}' role='img'"
        f" aria-label='GPUs allocated and used over time'>"
        f"<rect x='{pad}' y='{pad}' width='{width - 2 * pad}' height='{height - 2 * pad}' fill='#f7f7f7'/>"
        f"{ticks}<text x='{width - pad}' y='{pad - 6}' text-anchor='end' font-size='11'>last"
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
        main = (
            f"<p>Signed in as {escape(caller.name)}"
            f"{' (admin: you see everyone)' if caller.admin else ' (you see your own shares and jobs)'}."
            " <small class='text-muted gpupool-refreshed'>This page reads the pool again every 15 s.</small></p>"
            "<h2>Occupancy</h2>"
            "<table class='gpupool-gpus table table-sm'><tr><th>Node</th><th>GPU</th><th>Model</th><th>Allocated</th>"
            "<th>Held by</th></tr>" + "".join(rows) + "</table>"
            "<h2>Allocation is not utilization</h2>" + plot
            + jobs_html(self.settings.get("training"), caller)
            + self.projects_html() + self.groups_html() + self.quota_html() + self.events_html()
        )
        self.finish(page_shell(self.hub_auth.hub_prefix, caller, main, self.xsrf_token.decode()))

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

    def groups_html(self) -> str:
        """Teaching labs: each group's build use against its `group_totals` limit."""
        totals = getattr(self.pool.quotas, "group_totals_milli", {}) or {}
        if not totals:
            return ""
        usage = self.pool.group_usage()
        caller = self.caller
        rows = "".join(
            f"<tr><td>{escape(g)}</td><td><meter min=0 max={limit} value={usage.get(g, 0)}></meter>"
            f" {format_gpus(usage.get(g, 0))} of {format_gpus(limit)}</td></tr>"
            for g, limit in sorted(totals.items()) if caller.admin or g in caller.groups)
        return ("<h2>Groups</h2><table class='gpupool-groups table table-sm'><tr><th>Group</th>"
                "<th>Build use of its total</th></tr>" + rows + "</table>") if rows else ""

    def quota_html(self) -> str:
        """Admins change the default build quota here (validated by the API, like the config file)."""
        if not self.caller.admin:
            return ""
        current = format_gpus(self.pool.quotas.limits_for([]).quota_milli)
        return ("<h2>Build quota</h2><form class='gpupool-quota row g-2' onsubmit='return gpupoolQuota(this)'>"
                f"<div class='col-auto'>Default build quota per user (now {escape(current)}):</div>"
                "<div class='col-auto'><input name='default_build_quota' class='form-control form-control-sm'"
                " size='6' placeholder='e.g. 0.5'></div><div class='col-auto'><button class='btn btn-sm"
                " btn-primary' type='submit'>Save</button></div><div class='col-auto gpupool-quota-result'></div>"
                "</form>")

    def events_html(self) -> str:
        caller = self.caller
        filters = {} if caller.admin else {"owner": caller.name}
        events = [e for e in self.pool.store.events(limit=300, **filters)
                  if e.kind in ("cull", "warn", "preempt", "requeue", "resume", "memory")][:30]
        items = "".join(f"<tr><td>{e.time:%Y-%m-%d %H:%M:%S}</td><td>{escape(e.kind)}</td>"
                        f"<td>{escape(e.message)}</td></tr>" for e in events) or "<tr><td>none yet</td></tr>"
        return f"<h2>Recent culls and preemptions</h2><table class='gpupool-events'>{items}</table>"


def jobs_html(training, caller) -> str:
    """Active jobs and the last ended ones: why each waits, its preemption, and Cancel."""
    if training is None:
        return ""
    from ..train.waiting import explain, last_preemption

    jobs = [j for j in training.jobs() if caller.admin or j.owner == caller.name]
    active = [j for j in jobs if j.state in ("queued", "running", "preempting")]
    ended = sorted((j for j in jobs if j not in active), key=lambda j: j.finished or 0, reverse=True)[:10]
    rows = []
    for j in active + ended:
        why = explain(training, j) or last_preemption(training.pool, j) or j.message or ""
        cancel = (f"<button class='btn btn-sm btn-outline-danger gpupool-cancel' data-job='{escape(j.id)}'"
                  " onclick='gpupoolCancel(this)'>Cancel</button>") if j in active else ""
        rows.append(f"<tr><td><code>{escape(j.id)}</code> {escape(j.name)}</td><td>{escape(j.owner)}</td>"
                    f"<td>{escape(j.project)}</td><td>{format_gpus(j.total_milli)}</td><td>{escape(j.state)}</td>"
                    f"<td>{escape(why)}</td><td>{cancel}</td></tr>")
    body = "".join(rows) or "<tr><td colspan=7>no jobs</td></tr>"
    return ("<h2>Train jobs</h2><table class='gpupool-jobs table table-sm'><tr><th>Job</th><th>Owner</th>"
            "<th>Project</th><th>GPUs</th><th>State</th><th>Why</th><th></th></tr>" + body + "</table>")


SCRIPT = """
<script>
const gpupoolXsrf = document.body.dataset.xsrf;
async function gpupoolCall(method, path, body) {
  const r = await fetch(path, {method, credentials: 'same-origin', body: body && JSON.stringify(body),
    headers: {'X-XSRFToken': gpupoolXsrf, 'Content-Type': 'application/json'}});
  const data = await r.json().catch(() => ({}));
  if (!r.ok) { throw new Error(data.message || ('HTTP ' + r.status)); }
  return data;
}
async function gpupoolRefresh() {
  // a cookie-authenticated fetch (not a navigation) must carry the XSRF token, as JupyterHub asks
  const r = await fetch(location.href, {credentials: 'same-origin', headers: {'X-XSRFToken': gpupoolXsrf}});
  if (!r.ok) { return; }
  const doc = new DOMParser().parseFromString(await r.text(), 'text/html');
  const fresh = doc.getElementById('gpupool-main');
  if (fresh && !document.querySelector('#gpupool-main input:focus')) {
    document.getElementById('gpupool-main').innerHTML = fresh.innerHTML;
  }
}
async function gpupoolCancel(button) {
  button.disabled = true;
  try { await gpupoolCall('DELETE', 'api/jobs/' + button.dataset.job); }
  catch (err) {
    button.insertAdjacentHTML('afterend', '<div class="text-danger gpupool-action-error"></div>');
    button.nextElementSibling.textContent = 'not cancelled: ' + err.message;
    return;
  }
  await gpupoolRefresh();
}
function gpupoolQuota(form) {
  const out = form.querySelector('.gpupool-quota-result');
  const value = Number(form.default_build_quota.value);
  gpupoolCall('PUT', 'api/quotas', {default_build_quota: value})
    .then(() => { out.textContent = 'saved'; out.className = 'col-auto gpupool-quota-result text-success';
                  setTimeout(gpupoolRefresh, 500); })
    .catch(err => { out.textContent = err.message; out.className = 'col-auto gpupool-quota-result text-danger'; });
  return false;
}
setInterval(gpupoolRefresh, 15000);
</script>
"""


def page_shell(hub_prefix: str, caller, main: str, xsrf: str) -> str:
    """The page in the hub's look: its stylesheet, logo and navigation bar around our content."""
    hub = escape(hub_prefix)
    admin = f"<li class='nav-item'><a class='nav-link' href='{hub}admin'>Admin</a></li>" if caller.admin else ""
    return (
        "<!doctype html><html><head><meta charset='utf-8'><title>GPU pool - JupyterHub</title>"
        f"<link rel='stylesheet' href='{hub}static/css/style.min.css'>"
        "<style>td,th{padding:4px 10px;text-align:left}h2{margin-top:1.5em;font-size:1.4em}"
        ".gpupool-plot{max-width:100%}</style></head>"
        f"<body data-xsrf='{escape(xsrf)}'>"
        "<nav class='navbar navbar-expand-sm bg-body-tertiary mb-4'><div class='container-fluid'>"
        f"<span id='jupyterhub-logo' class='navbar-brand'><a href='{hub}home'><img src='{hub}logo'"
        " alt='JupyterHub logo' class='jpy-logo' title='Home'></a></span>"
        "<ul class='navbar-nav me-auto mb-0'>"
        f"<li class='nav-item'><a class='nav-link' href='{hub}home'>Home</a></li>"
        f"<li class='nav-item'><a class='nav-link' href='{hub}token'>Token</a></li>{admin}"
        "<li class='nav-item'><a class='nav-link active' aria-current='page' href='.'>GPU pool</a></li></ul>"
        f"<span class='navbar-text me-2'>{escape(caller.name)}</span>"
        f"<a class='btn btn-sm btn-outline-dark' href='{hub}logout'>Logout</a></div></nav>"
        f"<div class='container' id='gpupool-main'><h1>GPU pool</h1>{main}</div>{SCRIPT}</body></html>"
    )


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
