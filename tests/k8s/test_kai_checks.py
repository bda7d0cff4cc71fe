"""Which KAI runs and what `helm test` reports: pure functions (the real cluster's answers are
in tests/cluster/test_kai_real.py)."""

from __future__ import annotations

from gpupool.kube.check import Expected, Seen, findings
from gpupool.kube.kai_version import KaiVersion, elastic_refusal, parse_version


def test_versions_are_read_from_tags_and_images() -> None:
    assert parse_version("v0.17.0") == (0, 17, 0) and parse_version("0.14.1") == (0, 14, 1)
    assert parse_version("ghcr.io/kai-scheduler/kai-scheduler/podgrouper:v0.17.0-fips") == (0, 17, 0)
    assert parse_version("registry:5000/podgrouper:latest") is None and parse_version("") is None


def test_elastic_jobs_need_kai_0_14_1() -> None:
    assert elastic_refusal(KaiVersion((0, 14, 1), "v0.14.1")) is None
    assert elastic_refusal(KaiVersion((0, 17, 0), "v0.17.0")) is None
    old = elastic_refusal(KaiVersion((0, 13, 1), "v0.13.1"), " (deployment kai-scheduler/pod-grouper)")
    assert "need KAI-Scheduler v0.14.1 or later" in old and "runs v0.13.1 (deployment" in old
    unknown = elastic_refusal(
        KaiVersion(None, "", "reading deployment kai-scheduler/pod-grouper: 403 Forbidden")
    )
    assert "unknown (reading deployment kai-scheduler/pod-grouper: 403 Forbidden)" in unknown
    assert "kai.version" in unknown


def test_helm_test_findings_say_what_is_missing_and_what_to_do() -> None:
    want = Expected(
        queues=["department-r", "v", "pool-ws", "v-ws"],
        priority_classes=["build", "train"],
        pools=["ws", "dgx"],
    )
    good = Seen(
        queues={"department-r", "v", "pool-ws", "v-ws", "other"},
        priority_classes={"build", "train"},
        shards={"default": "", "gpupool-ws": "ws", "gpupool-dgx": "dgx"},
        pool_nodes={"ws": 2, "dgx": 1},
        kai=KaiVersion((0, 17, 0), "v0.17.0"),
    )
    lines = findings(want, good)
    assert not [line for line in lines if line.startswith("FAIL")], lines
    assert "ok: node pool ws: 2 node(s) labelled kai.scheduler/node-pool=ws" in lines
    bad = Seen(
        queues={"department-r"},
        priority_classes=None,
        shards={"gpupool-ws": "ws"},
        pool_nodes={"ws": 1},
        kai=KaiVersion((0, 12, 0), "v0.12.0"),
        errors={"priority classes": "403 Forbidden"},
    )
    lines = findings(want, bad)
    assert (
        "FAIL: queues missing: v, pool-ws, v-ws (is KAI-Scheduler installed, with its CRDs? the chart's queues"
        " are kept on uninstall only)" in lines
    )
    assert "FAIL: cannot list priority classes: 403 Forbidden" in lines
    assert "FAIL: SchedulingShard gpupool-dgx missing (KAI's operator makes its scheduler)" in lines
    assert any(line.startswith("FAIL: KAI's default SchedulingShard is missing") for line in lines)
    assert any(line.startswith("FAIL: node pool dgx has no node: label its nodes") for line in lines)
    assert "ok: KAI-Scheduler v0.12.0 (elastic jobs are refused: they need v0.14.1 or later)" in lines
