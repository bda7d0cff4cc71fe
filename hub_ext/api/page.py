"""A plain status page: GPU occupancy for everyone, with names for admins."""

from __future__ import annotations

from html import escape

from tornado import web

from ..pool import format_gpus
from .auth import BaseHandler
from .pool import gpu_table


class StatusPage(BaseHandler):
    @web.authenticated
    def get(self) -> None:
        caller = self.caller
        rows = []
        for gpu in gpu_table(self.pool, caller):
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
        self.finish(
            "<!doctype html><html><head><title>gpupool</title>"
            "<style>body{font-family:sans-serif;margin:2em}td,th{padding:4px 10px;text-align:left}</style>"
            f"</head><body><h1>GPU pool</h1><p>Signed in as {escape(caller.name)}"
            f"{' (admin)' if caller.admin else ''}. <a href='{escape(self.hub_auth.hub_prefix)}home'>Back to the hub</a></p>"
            "<table><tr><th>Node</th><th>GPU</th><th>Model</th><th>Allocated</th><th>Held by</th></tr>"
            + "".join(rows) + "</table></body></html>"
        )
