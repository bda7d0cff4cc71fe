"""`python -m benchmarks.placement` calls a margin a win only when the 95 % interval of the
per-seed difference lies above 0: a small positive mean with a seed below the anchor is a
tie, and the verdict line says so. Its latency table has the heterogeneous openb cluster
beside the homogeneous one, with the same baseline."""

from __future__ import annotations

import math

import numpy as np
import pytest

from benchmarks.placement import robustness
from benchmarks.placement.__main__ import pick_mixes, verdict
from benchmarks.placement.paired import LOSS, TIE, WIN, paired_interval
from benchmarks.placement.robustness import Row, Workload
from benchmarks.placement.scale import openb_cluster, scale_run, scale_table

SEEDS = 10


def row(label: str, default: list[float], fgd: list[float], best_fit: list[float] | None = None) -> Row:
    best_fit = best_fit or [a - 2 for a in fgd]  # best-fit far behind: fgd is the anchor
    walls = [(1.0, 1.0)] * len(default)
    return Row(
        Workload(label, [], dict.fromkeys(("cpu", "share", "whole", "multi"), 25.0), False),
        {"frag-aware": default, "fgd": fgd, "best-fit": best_fit},
        {p: walls for p in ("frag-aware", "fgd", "best-fit")},
    )


def test_the_interval_is_students_t_of_the_paired_difference() -> None:
    ci = paired_interval([1.0, 2.0, 3.0, 4.0, 5.0], [0.0] * 5)
    half = 2.776 * math.sqrt(2.5) / math.sqrt(5)  # t(0.975, 4) x sd / sqrt(n)
    assert ci.mean == pytest.approx(3.0)
    assert (ci.low, ci.high) == pytest.approx((3.0 - half, 3.0 + half), abs=1e-9)
    # pairing: a seed that lifts both policies alike does not widen the interval
    lifted = paired_interval([95.0 + 0.2 + s for s in range(SEEDS)], [95.0 + s for s in range(SEEDS)])
    assert lifted.call == WIN and lifted.low == pytest.approx(0.2)


def test_a_small_positive_margin_with_a_seed_below_the_anchor_is_a_tie_not_a_win() -> None:
    # the case: a mean margin of +0.03 point where one seed is below the anchor
    anchor = [97.2, 97.3, 97.1, 97.25, 97.2, 97.3, 97.15, 97.2, 97.25, 97.2]
    ours = [
        a + d
        for a, d in zip(anchor, [0.10, -0.12, 0.08, 0.02, 0.05, 0.0, 0.09, -0.04, 0.07, 0.05], strict=True)
    ]
    ci = paired_interval(ours, anchor)
    assert ci.mean == pytest.approx(0.03) and ci.low < 0 < ci.high
    assert ci.call == TIE
    assert paired_interval(anchor, ours).call == TIE  # and the other way round


def test_a_margin_below_zero_on_every_seed_is_a_loss() -> None:
    assert paired_interval([96.9 + 0.01 * s for s in range(SEEDS)], [97.0] * SEEDS).call == LOSS


def test_the_anchor_is_the_better_rival_and_the_verdict_counts_ties_as_ties() -> None:
    fgd = [97.0 + 0.05 * (s % 3) for s in range(SEEDS)]
    clear = row("clear", [a + 0.3 + 0.01 * s for s, a in enumerate(fgd)], fgd)
    close = row("close", [a + (0.1 if s % 2 else -0.04) for s, a in enumerate(fgd)], fgd)
    # best-fit ahead of fgd here: the default is compared with best-fit, seed by seed
    packing = row("packing", [a + 0.5 for a in fgd], [a - 1 for a in fgd], [a + 0.4 for a in fgd])
    assert packing.anchor == "best-fit" and packing.margin == pytest.approx(0.1)
    assert close.margin > 0 and close.interval.call == TIE
    calls = robustness.calls([clear, close, packing])
    assert [r.workload.label for r in calls[WIN]] == ["clear", "packing"]
    assert [r.workload.label for r in calls[TIE]] == ["close"]

    line = verdict([clear, close, packing], 4.6, None)
    assert line.startswith("VERDICT placement:")
    assert "3 of the 20 workloads x 10 seeds" in line  # a part of the grid is said to be one
    assert "2 wins, 1 ties (close +0.03), 0 losses;" in line
    assert "met (no loss; ahead shown on 2 of 3, the ties not shown ahead)" in line

    behind = row("behind", [a - 0.2 for a in fgd], fgd)
    assert "NOT met" in verdict([clear, behind], 4.6, None)
    assert "1 losses (behind -0.20)" in verdict([clear, behind], 4.6, None)

    table = robustness.table([clear, close], {})
    assert "| fgd | +0.03 [" in table and "| tie |" in table


def test_the_heterogeneous_cluster_has_openbs_models_and_the_same_baseline_in_the_same_run() -> None:
    inv = openb_cluster(7_000)
    assert sum(len(n.gpus) for n in inv.nodes) >= 7_000
    assert {n.model for n in inv.nodes} >= {"G2", "T4", "P100", "V100M16", "V100M32", "G3", "A10"}
    assert len({n.name for n in inv.nodes}) == len(inv.nodes)
    assert len({n.cpu_milli for n in inv.nodes}) > 1  # each node keeps its own CPU

    run = scale_run([200])
    text = scale_table(run)
    assert "| homogeneous | 200 |" in text and "| openb | 200 |" in text
    for kind in ("homogeneous", "openb"):
        for policy in ("frag-aware", "best-fit"):
            assert 0 < run["p50_cpu_ms"][(kind, 200, policy)] <= run["p99_cpu_ms"][(kind, 200, policy)]
    line = verdict([row("x", [98.0] * 2, [97.0, 97.1])], 4.6, run)
    assert "homogeneous" in line and "openb" in line and "best-fit" in line and "target <= 5 ms" in line


def test_mixes_are_picked_by_label_and_an_unknown_label_is_refused() -> None:
    assert len(pick_mixes("all")) == 15 and pick_mixes("none") == []
    picked = pick_mixes("cpu0-share45-whole40-multi15,cpu20-share45-whole35-multi0")
    assert [m.label for m in picked] == ["cpu0-share45-whole40-multi15", "cpu20-share45-whole35-multi0"]
    assert pick_mixes("cpu0-share45-whole40-multi15,cpu9-nope") is None


def test_a_large_cluster_is_filled_chunk_by_chunk_to_70_percent_everywhere(monkeypatch) -> None:
    import random

    from benchmarks.data import shared_data
    from benchmarks.placement import scale
    from gpupool.sim.traces import read_pods

    pods = [
        p for p in read_pods(shared_data("openb", "openb_pod_list_default.csv")) if p.request.num_gpu <= 8
    ]
    monkeypatch.setattr(scale, "FILL_CHUNK_GPUS", 200)
    inv = scale.openb_cluster(800)
    state = scale.filled(inv, pods, random.Random(1))
    free = state.gpu_free.clip(min=0).sum(axis=1)
    halves = np.array_split(np.arange(len(inv.nodes)), 2)
    used = [1 - free[p].sum() / (1000 * state.gpu_count[p].sum()) for p in halves]
    # both halves of the cluster are filled, not the first more (one piece: 86 % and 54 %)
    assert all(0.65 < u < 0.75 for u in used), used
    assert 0.7 <= state.used_milli() / inv.capacity_milli < 0.72
