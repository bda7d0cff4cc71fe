"""The chart as an admin pulls it: `helm lint --strict` and `helm package` with the real helm (built
from the pin in tests/cluster/go/helm), one version with the Python package, and a values reference
generated from the schema helm checks values against."""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import tarfile
import tomllib
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
CHART = REPO / "helm" / "gpupool"
VERSION = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]


def _reference():
    spec = importlib.util.spec_from_file_location("values_reference", REPO / "helm" / "values_reference.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_chart_and_package_are_one_release():
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert chart["version"] == VERSION and chart["appVersion"] == VERSION
    assert chart["maintainers"] and all(m["name"] for m in chart["maintainers"])


def test_values_reference_is_generated_from_the_schema():
    reference = _reference()
    text = reference.render()
    assert (REPO / "docs" / "chart-values.md").read_text() == text, "run python helm/values_reference.py"
    # every top-level key the chart admits has its row, with its default from values.yaml
    schema = yaml.safe_load((CHART / "values.schema.json").read_text())
    for key in schema["properties"]:
        assert f"| `{key}` |" in text
    assert "| `nodeAgent.port` | integer | `9402` | minimum 1; maximum 65535 |" in text


@pytest.fixture(scope="module")
def helm_binary() -> Path:
    from tests.cluster import build

    try:
        return build.optional("helm") / "helm"
    except (FileNotFoundError, RuntimeError) as err:  # no Go, or it does not build
        if os.environ.get("CI"):
            pytest.fail(f"helm is needed in CI: {err}")
        pytest.skip(f"no helm: {err}")


def test_helm_lints_strictly_and_packages_the_chart(helm_binary: Path, tmp_path: Path):
    env = {
        **os.environ,
        "HELM_CACHE_HOME": str(tmp_path / "cache"),
        "HELM_CONFIG_HOME": str(tmp_path / "config"),
        "HELM_DATA_HOME": str(tmp_path / "data"),
    }

    def helm(*args: str) -> str:
        proc = subprocess.run([str(helm_binary), *args], capture_output=True, text=True, env=env)
        assert proc.returncode == 0, f"helm {' '.join(args)}:\n{proc.stdout}{proc.stderr}"
        return proc.stdout

    lint = helm("lint", "--strict", str(CHART))
    assert "1 chart(s) linted, 0 chart(s) failed" in lint and "[WARNING]" not in lint
    helm("package", str(CHART), "-d", str(tmp_path))
    package = tmp_path / f"gpupool-{VERSION}.tgz"
    names = tarfile.open(package).getnames()
    assert {"gpupool/Chart.yaml", "gpupool/values.yaml", "gpupool/values.schema.json"} <= set(names)
    assert "gpupool/templates/node-agent.yaml" in names
    shown = yaml.safe_load(helm("show", "chart", str(package)))
    assert shown["version"] == VERSION and shown["appVersion"] == VERSION
    # the packaged chart still refuses what its schema refuses (as `helm install` would)
    bad = tmp_path / "bad.yaml"
    bad.write_text("nodeAgent:\n  port: 0\n")
    proc = subprocess.run(
        [str(helm_binary), "template", "gpupool", str(package), "-f", str(bad)],
        capture_output=True,
        text=True,
        env=env,
    )
    assert proc.returncode != 0 and "port" in proc.stderr
    assert shutil.which("helm", path=str(helm_binary.parent))


def test_image_tags_follow_the_release_unless_an_admin_pins_one():
    """Every image gpupool ships is tagged with the release that made it: the node agent's tag
    defaults to the chart's appVersion (a bump of pyproject's version moves it; a hard-coded
    tag stayed behind), and the z2jh overlay's hub and single-user images name the same version.
    The agent runs its own small image (helm/node-agent-image); `helm test`'s pod, which needs
    gpupool's Kubernetes client, the hub's."""
    import helm_python

    def rendered_image(values: dict | None, template: str, kind: str) -> str:
        out = helm_python.Chart.load(str(CHART)).render(values, name="gpupool", namespace="gpupool")
        for doc in yaml.safe_load_all(out[f"gpupool/templates/{template}"]):
            if doc and doc["kind"] == kind:
                spec = doc["spec"]["template"]["spec"] if kind == "DaemonSet" else doc["spec"]
                return spec["containers"][0]["image"]
        raise AssertionError(f"no {kind} rendered in {template}")

    def agent_image(values: dict | None) -> str:
        return rendered_image(values, "node-agent.yaml", "DaemonSet")

    assert agent_image(None) == f"registry.example.org/gpupool-node-agent:{VERSION}"
    assert agent_image({"nodeAgent": {"image": {"tag": "site-7"}}}).endswith(":site-7")
    assert rendered_image(None, "tests.yaml", "Pod") == f"registry.example.org/gpupool-hub:{VERSION}"
    pinned = {"tests": {"image": {"name": "r.example/hub", "tag": "site-7"}}}
    assert rendered_image(pinned, "tests.yaml", "Pod") == "r.example/hub:site-7"
    overlay = yaml.safe_load((REPO / "helm" / "z2jh-values.yaml").read_text())
    assert overlay["hub"]["image"]["tag"] == VERSION and overlay["singleuser"]["image"]["tag"] == VERSION
    for example in (REPO / "helm" / "examples").glob("*.yaml"):
        values = yaml.safe_load(example.read_text())
        for key in ("nodeAgent", "tests"):
            tag = ((values.get(key) or {}).get("image") or {}).get("tag")
            assert tag in (None, "", VERSION), (example.name, key, tag)
