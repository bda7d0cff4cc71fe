"""The cluster benchmark replays through the real core: a small world, checked for what its
table claims (no lost kernel state with parking, capacity never exceeded, a readable plot)."""

from __future__ import annotations

import pytest

from benchmarks.cluster.__main__ import run
from benchmarks.cluster.plot import svg_lines
from benchmarks.cluster.world import build


@pytest.fixture(scope="module")
def results():
    w = build(3, quiet_h=20, researchers=6, days=2, teams=2)
    return w, {k: run(w, k) for k in ("static", "pooled", "parking")}


def test_parking_keeps_every_kernel_and_culling_does_not(results):
    _, r = results
    assert r["parking"].lost_states == 0 and r["parking"].parks > 0 and r["parking"].resume_waits
    assert r["static"].lost_states == 0 and r["static"].parks == 0 and r["static"].culls == 0
    assert r["pooled"].parks == 0


def test_no_world_uses_more_than_its_capacity(results):
    w, r = results
    for m in r.values():
        assert 0 < m.utilization <= m.allocation <= 1.0
        assert all(b <= w.capacity_gpus * 3600 + 1e-6 for b in m.hourly_busy)


def test_the_plot_is_svg_with_one_line_per_world():
    svg = svg_lines({"a": [10, 20], "b": [30, 40]}, "title <x>", "hour")
    assert svg.startswith("<svg") and svg.count("<polyline") == 2 and "title &lt;x&gt;" in svg
