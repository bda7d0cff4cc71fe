"""The chart ships its Grafana dashboards as ConfigMaps for Grafana's sidecar, and Prometheus
Operator ServiceMonitors only when asked."""

from __future__ import annotations

import json

import jsonschema
import pytest
import yaml

from tests import dashboards
from tests.k8s.test_chart import CHART, render


def kinds(docs: list[dict], kind: str) -> list[dict]:
    return [d for d in docs if d["kind"] == kind]


def test_dashboards_render_as_sidecar_configmaps_and_no_monitor_by_default() -> None:
    default = render(None)
    assert not kinds(default, "ServiceMonitor")
    assert not [d for d in kinds(default, "ConfigMap") if "grafana_dashboard" in d["metadata"]["labels"]]

    docs = render({"dashboards": {"enabled": True, "folderAnnotation": {"grafana_folder": "GPUs"}}})
    maps = [d for d in kinds(docs, "ConfigMap") if d["metadata"]["name"].endswith("-dashboard")]
    assert {m["metadata"]["name"] for m in maps} == {
        "gpupool-pool-dashboard",
        "gpupool-people-dashboard",
        "gpupool-culler-dashboard",
    }
    shipped = dashboards.load()
    for m in maps:
        assert m["metadata"]["labels"]["grafana_dashboard"] == "1"
        assert m["metadata"]["annotations"] == {"grafana_folder": "GPUs"}
        ((file, text),) = m["data"].items()
        assert json.loads(text) == shipped[file]  # valid JSON, byte for byte the dashboard

    # another sidecar's label and value, another namespace
    other = render(
        {"dashboards": {"enabled": True, "label": "dash", "labelValue": "yes", "namespace": "monitoring"}}
    )
    m = next(d for d in kinds(other, "ConfigMap") if d["metadata"]["name"] == "gpupool-pool-dashboard")
    assert m["metadata"]["labels"]["dash"] == "yes" and m["metadata"]["namespace"] == "monitoring"


def test_service_monitors_scrape_the_hub_the_agents_and_the_culler() -> None:
    docs = render(
        {
            "serviceMonitor": {
                "enabled": True,
                "labels": {"release": "kps"},
                "hub": {"tokenSecret": {"name": "metrics-token"}},
                "cullerPort": 9401,
            }
        }
    )
    monitors = {d["metadata"]["name"]: d for d in kinds(docs, "ServiceMonitor")}
    hub, agent = monitors["gpupool-hub"], monitors["gpupool-node-agent"]
    assert hub["metadata"]["namespace"] == "jupyterhub" and hub["metadata"]["labels"]["release"] == "kps"
    assert hub["spec"]["endpoints"][0]["path"] == "/hub/metrics"
    assert hub["spec"]["endpoints"][0]["authorization"]["credentials"] == {
        "name": "metrics-token",
        "key": "token",
    }
    assert hub["spec"]["endpoints"][1]["port"] == "culler-metrics"
    culler = next(d for d in kinds(docs, "Service") if d["metadata"]["name"] == "gpupool-culler-metrics")
    assert culler["spec"]["ports"][0]["port"] == 9401
    assert set(hub["spec"]["selector"]["matchLabels"].items()) <= set(culler["metadata"]["labels"].items())
    # the agent monitor selects the agents' Service and sends the token they require
    service = next(d for d in kinds(docs, "Service") if d["metadata"]["name"] == "gpupool-node-agent")
    assert set(agent["spec"]["selector"]["matchLabels"].items()) <= set(service["metadata"]["labels"].items())
    assert agent["spec"]["endpoints"][0]["authorization"]["credentials"]["name"] == "gpupool-node-agent-token"


def test_bad_dashboard_and_monitor_values_are_refused() -> None:
    schema = json.loads((CHART / "values.schema.json").read_text())
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    jsonschema.validate(values, schema)
    for bad in (
        {"dashboards": {"labelValue": 1}},
        {"dashboards": {"enable": True}},
        {"serviceMonitor": {"interval": "soon"}},
        {"serviceMonitor": {"cullerPort": 70000}},
    ):
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate({**values, **{k: {**values[k], **v} for k, v in bad.items()}}, schema)
