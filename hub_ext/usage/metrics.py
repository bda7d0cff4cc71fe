"""Usage as Prometheus gauges on the hub's own endpoint (/hub/metrics, JupyterHub's registry):
GPU-hours allocated, used, wasted and parked over the last `c.Usage.metrics_window_s` per user,
group, project, node pool and kind; jobs run, failed and preempted; train waits per project;
how much of each budget is used. Computed from the event log at most once a minute, in a worker
thread: a scrape answers at once with the last figures (none yet on the very first) and asks for new
ones when they are older than a minute; users' groups are read once, on the loop, per computation
(it once took the hub's loop 2-5 s with 166 users)."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

from prometheus_client import REGISTRY
from prometheus_client.core import GaugeMetricFamily

if TYPE_CHECKING:
    from gpupool.usage.service import UsageService

log = logging.getLogger("gpupool.usage")
DIMENSIONS = ("user", "group", "project", "pool", "kind")
CACHE_S = 60.0
MEASURES = (
    ("allocated_gpu_hours", "GPU-hours held (fraction-weighted)"),
    ("used_gpu_hours", "GPU-hours the GPU was busy, where measured"),
    ("measured_gpu_hours", "GPU-hours held with GPU use data"),
    ("waste_gpu_hours", "GPU-hours held idle, where measured"),
    ("parked_hours", "hours workspaces were parked"),
    ("cost", "cost at c.Usage.prices"),
)
_registered: list[UsageCollector] = []


class UsageCollector:
    def __init__(self, usage: UsageService) -> None:
        self.usage = usage
        self._at = -1e18
        self._families: list[GaugeMetricFamily] = []
        self._busy = threading.Lock()  # held while a computation runs: one at a time

    def describe(self) -> list[GaugeMetricFamily]:
        """The names only: the registry need not compute the figures to register them."""
        names = [f"gpupool_usage_{key}" for key, _ in MEASURES]
        names += ["gpupool_usage_jobs", "gpupool_train_wait_seconds", "gpupool_budget_used_ratio"]
        return [GaugeMetricFamily(n, n) for n in names]

    def collect(self) -> Iterator[GaugeMetricFamily]:
        now = time.monotonic()
        if now - self._at >= CACHE_S and self._busy.acquire(blocking=False):
            self._at = now
            try:
                groups = self.usage.group_map() if self.usage.group_map is not None else None
            except Exception:  # noqa: BLE001 - a scrape must not fail the hub's other metrics
                log.exception("usage metrics: reading users' groups failed")
                groups = None
            of = (lambda owner: groups.get(owner, ())) if groups is not None else None
            threading.Thread(
                target=self._refresh, args=(of,), name="gpupool usage metrics", daemon=True
            ).start()
        yield from self._families

    def _refresh(self, groups_of: Callable[[str], tuple[str, ...]] | None) -> None:
        try:
            self._families = self._compute(groups_of)
        except Exception:  # noqa: BLE001 - the next scrape tries again
            log.exception("usage metrics failed")
        finally:
            self._busy.release()

    def _compute(self, groups_of: Callable[[str], tuple[str, ...]] | None = None) -> list[GaugeMetricFamily]:
        usage = self.usage
        window = int(usage.cfg.metrics_window_s)
        b = usage.now() + 1
        a = b - window
        families = {
            key: GaugeMetricFamily(
                f"gpupool_usage_{key}", f"{text} in the last {window} s", labels=["dimension", "key"]
            )
            for key, text in MEASURES
        }
        jobs = GaugeMetricFamily(
            "gpupool_usage_jobs",
            f"train jobs in the last {window} s, by outcome",
            labels=["project", "outcome"],
        )
        waits = GaugeMetricFamily(
            "gpupool_train_wait_seconds",
            f"how long train jobs that first started in the last {window} s waited",
            labels=["project", "quantile"],
        )
        for by in DIMENSIONS:
            report = usage.report(a, b, by, limit=10_000, groups_of=groups_of)
            for row in report["rows"]:
                for key, _ in MEASURES:
                    families[key].add_metric([by, row["key"]], row[key])
                if by == "project":
                    for outcome in ("run", "failed", "preempted"):
                        jobs.add_metric([row["key"], outcome], row[f"jobs_{outcome}"])
            if by == "project":
                for project, w in report["waits"].items():
                    for q, key in (("0.5", "p50_s"), ("0.95", "p95_s")):
                        if w[key] is not None:
                            waits.add_metric([project, q], w[key])
        budget = GaugeMetricFamily(
            "gpupool_budget_used_ratio", "share of each GPU-hour budget used", labels=["user", "target"]
        )
        for u in usage.budget_users(groups_of=groups_of):
            for bgt in u["budgets"]:
                budget.add_metric([u["user"], bgt["target"]], bgt["used_pct"] / 100)
        return [*families.values(), jobs, waits, budget]


def register_metrics(usage: UsageService) -> UsageCollector:
    """Register (once per process; a second call replaces the first) on JupyterHub's registry."""
    while _registered:
        try:
            REGISTRY.unregister(_registered.pop())
        except KeyError:
            pass
    collector = UsageCollector(usage)
    REGISTRY.register(collector)
    _registered.append(collector)
    return collector
