"""Interactive sessions built from Adobe's real GPU cell runs, calibrated to the published
statistics of the same service (../shared/data/README.md).

The cell file has no session boundaries, so sessions are assembled (seeded, reproducible):
* lifetime: lognormal, median 21 h (the 59-session sample's median), capped at 72 h;
* GPUs held: 1, 4 or 8, in the proportions of the cell file;
* the session's GPU-busy share u: lognormal with median 14 % and mean 25.7 % (the sample's
  median session and its GPU-time-used / GPU-time-reserved), capped at 90 %;
* an active phase: real cell durations drawn from the file, separated by gaps drawn from a
  lognormal with the published median 3 min and p90 38 min, until the busy time reaches
  u x lifetime; then the notebook stays open, unused, until its lifetime ends.
The user is active in Jupyter during the active phase and absent afterwards.
"""

from __future__ import annotations

import csv
import math
import random
from dataclasses import dataclass

from benchmarks.data import shared_data

GAP_MU = math.log(3 * 60)
GAP_SIGMA = math.log(38 / 3) / 1.2816  # p90 38 min


@dataclass(frozen=True)
class Session:
    gpus: int
    lifetime_s: float
    cells: tuple[tuple[float, float], ...]  # (start, end) seconds from session start

    @property
    def active_end(self) -> float:
        return self.cells[-1][1] if self.cells else 0.0

    @property
    def busy_s(self) -> float:
        return sum(e - s for s, e in self.cells)


def load_cells() -> tuple[list[float], list[int]]:
    durations, gpus = [], []
    with open(shared_data("notebooks_adobe", "sensei_june_60sec.csv")) as f:
        for row in csv.DictReader(f):
            durations.append(max(1.0, float(row["duration"])) * 60)
            gpus.append(int(row["num_gpu"]))
    return durations, gpus


def make_sessions(n: int, seed: int = 1) -> list[Session]:
    durations, gpus = load_cells()
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        lifetime = min(72 * 3600, rng.lognormvariate(math.log(21 * 3600), 0.9))
        u = min(0.9, rng.lognormvariate(math.log(0.14), math.sqrt(2 * math.log(0.257 / 0.14))))
        budget = u * lifetime
        t, busy, cells = 0.0, 0.0, []
        while busy < budget:
            d = min(rng.choice(durations), budget - busy + 60)
            if t + d > lifetime:
                break
            cells.append((t, t + d))
            busy += d
            t += d + rng.lognormvariate(GAP_MU, GAP_SIGMA)
        out.append(Session(gpus=rng.choice(gpus), lifetime_s=lifetime, cells=tuple(cells)))
    return out
