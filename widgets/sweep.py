"""A sweep's runs side by side: state, the parameters each got and its final printed metrics
(api/sweeps/<id>), followed until every run has ended."""

from __future__ import annotations

import html
import json
import shlex
import threading
from typing import Any

import ipywidgets as w

from gpupool.train.sweep import SweepError, combinations
from gpupool.vocab.states import UNFINISHED
from gpupool.widgets.client import Client, GPUPoolError

MAX_TEXT = 4000  # a sweep field longer than this is not a sweep anyone typed


def sweep_spec(items: list[str]) -> dict[str, list[object]]:
    """`["lr=0.1,0.01", "opt=adam,sgd"]` (each `%%train --sweep`, or the widget's field split
    at spaces) -> `{"lr": [0.1, 0.01], "opt": ["adam", "sgd"]}`. Values are JSON, else bare
    words (strings). The hub checks the same bounds again."""
    spec: dict[str, list[object]] = {}
    for item in items:
        key, eq, values = item.partition("=")
        if not eq or not key:
            raise SweepError(f"sweep: {item!r} is not KEY=V1,V2 (e.g. lr=0.1,0.01)")
        if key in spec:
            raise SweepError(f"sweep: {key} is given twice; list its values once, separated by commas")
        if not values or "" in values.split(","):
            raise SweepError(f"sweep: {key} needs values separated by commas, e.g. {key}=0.1,0.01")
        spec[key] = [_value(v) for v in values.split(",")]
    return spec


def _value(text: str) -> object:
    try:
        return json.loads(text)
    except ValueError:
        return text  # a bare word is a string


def parse_sweep_field(text: str) -> tuple[dict[str, list[Any]], int]:
    """The widget's sweep field (`lr=0.1,0.01 batch=32,64`, as `%%train --sweep`): the spec and
    how many jobs it submits ({} and 1 when empty). Raises SweepError with what to fix."""
    if len(text) > MAX_TEXT:
        raise SweepError(f"sweep: at most {MAX_TEXT} characters")
    try:
        items = shlex.split(text)
    except ValueError as err:  # unbalanced quotes
        raise SweepError(f"sweep: {err}") from None
    if not items:
        return {}, 1
    spec = sweep_spec(items)
    return spec, len(combinations(spec))


def sweep_html(data: dict[str, Any]) -> str:
    """The table: one row per run, its parameters, then every metric any run printed."""
    runs = data.get("runs", [])
    params = [str(p) for p in data.get("parameters", [])]
    metrics = sorted({str(k) for r in runs for k in (r.get("metrics") or {})})
    head = "".join(f"<th>{html.escape(h)}</th>" for h in ["run", "state", *params, *metrics])
    rows = []
    for r in runs:
        job = r.get("job", {})
        cells = [job.get("name", ""), job.get("state", "")]
        cells += [r.get("parameters", {}).get(p, "") for p in params]
        cells += [f"{r['metrics'][m]:.4g}" if m in (r.get("metrics") or {}) else "" for m in metrics]
        rows.append("<tr>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in cells) + "</tr>")
    return f"<table><tr>{head}</tr>{''.join(rows)}</table>"


class SweepTable(w.VBox):
    def __init__(
        self,
        sweep_id: str,
        client: Client | None = None,
        follow: bool = True,
        interval: float = 5.0,
        **kwargs: Any,
    ) -> None:
        self.sweep_id, self.client, self.interval = sweep_id, client, interval
        self.table, self.status = w.HTML(), w.HTML()
        self._stop = threading.Event()
        super().__init__([w.HTML(f"<b>sweep {html.escape(sweep_id)}</b>"), self.table, self.status], **kwargs)
        data = self.refresh()
        if follow and any(r["job"].get("state") in UNFINISHED for r in data.get("runs", [])):
            threading.Thread(target=self._follow, name="gpupool-sweep", daemon=True).start()

    def refresh(self) -> dict[str, Any]:
        try:
            data = (self.client or Client()).get(f"api/sweeps/{self.sweep_id}")
        except GPUPoolError as err:
            self.status.value = f"<small style='color:#b00'>{html.escape(str(err))}</small>"
            return {}
        self.table.value = sweep_html(data)
        return data

    def _follow(self) -> None:
        failures = 0
        while not self._stop.wait(self.interval):
            data = self.refresh()
            failures = failures + 1 if not data else 0
            if (
                data and not any(r["job"].get("state") in UNFINISHED for r in data["runs"])
            ) or failures >= 30:
                return

    def close(self) -> None:
        self._stop.set()
        super().close()
