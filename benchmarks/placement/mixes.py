"""Workload mixes resampled from the openb `default` trace by class shares.

A pod belongs to one of four classes: CPU-only (no GPU), sharing (one GPU, less than
1000 milli), whole (one whole GPU) and multi (two or more GPUs). A mix is a share per
class; its pod list has as many pods as the `default` trace, drawn with replacement
from each class's pods of that trace, so every pod shape is a real one and only the
proportions change. The draw is seeded (`MIX_SEED`), so every run sees the same lists.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from gpupool.pool import Request
from gpupool.sim.traces import TracePod

CLASSES = ("cpu", "share", "whole", "multi")
MIX_SEED = 2026  # the resampling seed; the protocol's own seeds are 42, 43, ...


def class_of(req: Request) -> str:
    if req.num_gpu == 0:
        return "cpu"
    if req.is_sharing:
        return "share"
    return "whole" if req.num_gpu == 1 else "multi"


@dataclass(frozen=True)
class Mix:
    """Percent of pods per class (sums to 100)."""

    cpu: int
    share: int
    whole: int
    multi: int

    def __post_init__(self) -> None:
        if (
            min(self.cpu, self.share, self.whole, self.multi) < 0
            or self.cpu + self.share + self.whole + self.multi != 100
        ):
            raise ValueError(f"class shares must be >= 0 and sum to 100: {self}")

    @property
    def label(self) -> str:
        return f"cpu{self.cpu}-share{self.share}-whole{self.whole}-multi{self.multi}"


def grid() -> list[Mix]:
    """CPU-only 0/20/40 %, multi-GPU 0/15/35 %, sharing 20/45/70 %, whole GPU the rest,
    kept where whole is 10..60 %: 15 mixes covering the ranges of issue 13."""
    out = []
    for cpu in (0, 20, 40):
        for multi in (0, 15, 35):
            for share in (20, 45, 70):
                whole = 100 - cpu - multi - share
                if 10 <= whole <= 60:
                    out.append(Mix(cpu, share, whole, multi))
    return out


def shares_of(pods: list[TracePod]) -> dict[str, float]:
    """The class shares of a pod list, in percent."""
    counts = dict.fromkeys(CLASSES, 0)
    for p in pods:
        counts[class_of(p.request)] += 1
    return {k: 100 * v / len(pods) for k, v in counts.items()}


def resample(pods: list[TracePod], mix: Mix, size: int | None = None, seed: int = MIX_SEED) -> list[TracePod]:
    """`size` pods (default: as many as `pods`) with `mix`'s class shares, drawn with
    replacement from the pods of each class."""
    by_class: dict[str, list[TracePod]] = {k: [] for k in CLASSES}
    for p in pods:
        by_class[class_of(p.request)].append(p)
    size = size or len(pods)
    rng = random.Random(f"{seed}-{mix.label}")
    out: list[TracePod] = []
    for cls in CLASSES:
        n = round(size * getattr(mix, cls) / 100)
        if n and not by_class[cls]:
            raise ValueError(f"the trace has no {cls} pods to draw from")
        out += [p for p in (rng.choice(by_class[cls]) for _ in range(n))]
    return [TracePod(f"{mix.label}-{i}", p.request) for i, p in enumerate(out)]
