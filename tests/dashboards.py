"""The chart's Grafana dashboards and the series their PromQL names, checked against what the
hub, the culler and the node agent really export (Prometheus text exposition)."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

DASHBOARDS = Path(__file__).resolve().parents[1] / "helm" / "gpupool" / "dashboards"
# PromQL words that are not series: clauses and binary operators
KEYWORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "bool", "and", "or", "unless"}
CLAUSES = {"by", "without", "on", "ignoring", "group_left", "group_right"}
TOKEN = re.compile(
    r'"(?:\\.|[^"\\])*"|\'(?:\\.|[^\'\\])*\'|\[[^\]]*\]|\{[^}]*\}|\$\{?\w+\}?|\d[\w.]*|[A-Za-z_:][\w:]*|\S'
)
MATCHER = re.compile(r"([A-Za-z_]\w*)\s*(?:=~|!~|!=|=)")


def load() -> dict[str, dict]:
    return {p.name: json.loads(p.read_text()) for p in sorted(DASHBOARDS.glob("*.json"))}


def queries(dashboard: dict) -> Iterator[str]:
    """Every PromQL expression: the panels' targets and the query variables (label_values)."""
    for panel in dashboard["panels"]:
        for target in panel.get("targets", []):
            yield target["expr"]
    for var in dashboard["templating"]["list"]:
        if var["type"] == "query":
            q = var["query"]["query"] if isinstance(var["query"], dict) else var["query"]
            m = re.fullmatch(r"label_values\((.*),\s*(\w+)\)", q.strip())
            assert m, f"only label_values(selector, label) variables are checked: {q}"
            yield f"sum by ({m[2]}) ({m[1]})"


def names(expr: str) -> tuple[set[str], set[str]]:
    """The series names an expression selects and the label names it uses (in matchers and in
    by/without/on/ignoring lists)."""
    tokens = [t for t in TOKEN.findall(expr) if not t.isspace()]
    series: set[str] = set()
    labels: set[str] = set()
    i = 0
    while i < len(tokens):
        t, nxt = tokens[i], tokens[i + 1] if i + 1 < len(tokens) else ""
        if t.startswith("{"):
            labels |= set(MATCHER.findall(t))
        elif re.fullmatch(r"[A-Za-z_:][\w:]*", t):
            if t in CLAUSES and nxt == "(":
                close = tokens.index(")", i)
                labels |= {x for x in tokens[i + 2 : close] if x != ","}
                i = close
            elif nxt != "(" and nxt not in ("by", "without") and t not in KEYWORDS:  # sum by (..) (..)
                series.add(t)
        i += 1
    return series, labels


def exported(texts: list[str]) -> dict[str, set[str] | None]:
    """Series name -> its label names (None where the family has no sample to show them)."""
    out: dict[str, set[str] | None] = {}
    for text in texts:
        for fam in text_string_to_metric_families(text):
            out.setdefault(fam.name, None)
            if fam.type == "counter":  # the text names a counter's samples <name>_total
                out.setdefault(fam.name + "_total", None)
            for s in fam.samples:
                out[s.name] = (out.get(s.name) or set()) | set(s.labels)
                if fam.type != "counter":
                    out[fam.name] = (out.get(fam.name) or set()) | set(s.labels)
    return out


def unknown(texts: list[str]) -> list[str]:
    """What the dashboards ask for that no exposition has: empty when every query is answerable."""
    have = exported(texts)
    problems = []
    for file, dash in load().items():
        for expr in queries(dash):
            series, labels = names(expr)
            if not series:
                problems.append(f"{file}: no series in {expr!r}")
            for s in series - have.keys():
                problems.append(f"{file}: {s} is exported by nothing ({expr!r})")
            known = [have[s] for s in series if have.get(s) is not None]
            if known and len(known) == len(series):
                for label in labels - set().union(*known) - {"instance", "job"}:
                    problems.append(f"{file}: label {label} is on none of {sorted(series)} ({expr!r})")
    return problems


def culler_text() -> str:
    """The culler's exposition (gpupool.idle_culler.metrics) after one observed workspace and cull."""
    from gpupool.idle_culler.metrics import Metrics

    m = Metrics(registry=CollectorRegistry())
    ws = SimpleNamespace(owner="kim", name="", gpu_idle_s=30.0)
    m.observe(ws, 500, SimpleNamespace(util_pct=0, memory_mib=100), fresh=True)
    m.culls.labels(reason="park").inc()
    return generate_latest(m.registry).decode()


def node_agent_text() -> str:
    """The node agent's /metrics body for one pod on one GPU."""
    from gpupool.idle_culler.node_agent.server import Agent

    agent = Agent(nvml=None)
    agent.snapshot = {
        "time": 1.0,
        "error": None,
        "pods": [{"uid": "u1", "gpu_util_pct": 3, "memory_mib": 100}],
        "gpus": [{"uuid": "GPU-1", "util_pct": 3, "memory_used_mib": 100}],
    }
    return agent.metrics().decode()
