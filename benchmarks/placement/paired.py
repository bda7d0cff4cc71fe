"""Win, tie or loss from paired seeds: a 95 % t-interval of the per-seed difference.

Every policy of a workload runs the same seeds (the same shuffled arrival order), so the
default's allocation and the anchor's are paired by seed; the difference per seed removes
what the order itself does to both. A margin is a **win** only when the whole interval is
above 0, a **loss** when it is all below, and a **tie** otherwise — a positive mean whose
interval reaches 0 is not evidence that the default is ahead.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass

# Two-sided 95 % critical values of Student's t, by degrees of freedom (seeds - 1). A table
# rather than an inverse CDF: numpy has none and scipy is not a dependency.
T95 = (
    12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228,
    2.201, 2.179, 2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086,
    2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042,
)  # fmt: skip
MAX_SEEDS = len(T95) + 1

WIN, TIE, LOSS = "win", "tie", "loss"


@dataclass(frozen=True)
class Interval:
    mean: float  # mean of the per-seed differences (points of allocation)
    low: float
    high: float
    n: int

    @property
    def call(self) -> str:
        if self.low > 0:
            return WIN
        if self.high < 0:
            return LOSS
        return TIE

    def __str__(self) -> str:
        return f"{self.mean:+.2f} [{self.low:+.2f}, {self.high:+.2f}]"


def paired_interval(ours: list[float], anchor: list[float]) -> Interval:
    """The 95 % t-interval of `ours[i] - anchor[i]` (same seed i)."""
    if len(ours) != len(anchor):
        raise ValueError("paired samples need one value of each per seed")
    n = len(ours)
    if not 2 <= n <= MAX_SEEDS:
        raise ValueError(f"an interval needs 2..{MAX_SEEDS} seeds, got {n}")
    diffs = [a - b for a, b in zip(ours, anchor, strict=True)]
    mean = statistics.fmean(diffs)
    half = T95[n - 2] * statistics.stdev(diffs) / math.sqrt(n)
    return Interval(mean, mean - half, mean + half, n)
