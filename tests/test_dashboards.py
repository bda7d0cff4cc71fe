"""The chart's Grafana dashboards ask only for series that gpupool exports. Here the hub's usage
gauges by name only (UsageCollector.describe, no hub); tests/test_usage_hub.py checks the same
queries, labels included, against a running hub's /hub/metrics."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, generate_latest

from gpupool.usage.metrics import UsageCollector
from tests import dashboards


def hub_names_text() -> str:
    reg = CollectorRegistry()
    reg.register(UsageCollector(usage=None))  # type: ignore[arg-type]  # describe() reads nothing
    # the registry collects on generate_latest: give it the described families, empty
    collector = next(iter(reg._collector_to_names))  # noqa: SLF001
    collector.collect = collector.describe  # type: ignore[method-assign]
    return generate_latest(reg).decode()


def test_every_dashboard_query_names_an_exported_series() -> None:
    assert set(dashboards.load()) == {"gpupool-pool.json", "gpupool-people.json", "gpupool-culler.json"}
    texts = [hub_names_text(), dashboards.culler_text(), dashboards.node_agent_text()]
    assert dashboards.unknown(texts) == []


def test_a_misspelt_series_or_label_is_caught() -> None:
    texts = [dashboards.culler_text(), dashboards.node_agent_text()]
    assert dashboards.names('sum by (reason) (increase(gpupool_culls_total{reason!~"park"}[5m])) / 2') == (
        {"gpupool_culls_total"},
        {"reason"},
    )
    have = dashboards.exported(texts)
    assert have["gpupool_culls_total"] == {"reason"} and "gpupool_culls" in have
    assert "gpupool_pod_gpu_utilization_pct" in have and "gpupool_pod_gpu_util_pct" not in have
