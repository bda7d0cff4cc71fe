"""Interactive sessions built from Adobe's real GPU cell runs, calibrated to the published
statistics of the same service (../shared/data/README.md).

The cell file has no session boundaries, so sessions are assembled (seeded, reproducible):
* lifetime: lognormal, median 21 h (the 59-session sample's median), capped at 72 h;
* GPUs held: 1, 4 or 8, in the proportions of the cell file;
* an active phase: real cell durations drawn from the file, separated by gaps drawn from a
  lognormal with the published median 3 min and p90 38 min; its length is a share f of the
  lifetime, f lognormal (capped at 1) with median and spread calibrated (`calibrate`) to the
  two published busy figures: the median session's GPU busy 14 % of its time, and GPU time
  used 25.7 % of GPU time reserved over all sessions; then the notebook stays open, unused,
  until its lifetime ends (a cell still running then runs to its end, within the lifetime);
* a workday: a session opens between 08:00 and 16:00; the user is at the notebook (active in
  Jupyter) from 08:00 to 18:00 while the active phase lasts, and starts cells only then — a
  gap that reaches past 18:00 ends next morning (a cell started before may run on overnight).
  Every day is a workday (lifetimes are at most 3 days).
"""

from __future__ import annotations

import csv
import functools
import math
import random
import statistics
from dataclasses import dataclass

from benchmarks.data import shared_data

GAP_MU = math.log(3 * 60)
GAP_SIGMA = math.log(38 / 3) / 1.2816  # p90 38 min


DAY = 86400.0
WORK_START, WORK_END = 8 * 3600.0, 18 * 3600.0  # the user's hours at the notebook


def at_work(tod: float) -> bool:
    return WORK_START <= tod % DAY < WORK_END


def next_morning(tod: float) -> float:
    """Seconds from time of day `tod` (may exceed a day) to the next 08:00."""
    day_start = (tod // DAY) * DAY
    morning = day_start + WORK_START
    return (morning if tod < morning else morning + DAY) - tod


@dataclass(frozen=True)
class Session:
    gpus: int
    lifetime_s: float
    cells: tuple[tuple[float, float], ...]  # (start, end) seconds from session start
    start_tod: float = 9 * 3600.0  # time of day it opened, seconds after midnight

    def user_present(self, t: float) -> bool:
        """At the notebook (Jupyter activity) at `t` seconds into the session."""
        return t <= self.active_end and at_work(self.start_tod + t)

    @property
    def active_end(self) -> float:
        return self.cells[-1][1] if self.cells else 0.0

    @property
    def busy_s(self) -> float:
        return sum(e - s for s, e in self.cells)


@functools.cache
def load_cells() -> tuple[list[float], list[int]]:
    durations, gpus = [], []
    with open(shared_data("notebooks_adobe", "sensei_june_60sec.csv")) as f:
        for row in csv.DictReader(f):
            durations.append(max(1.0, float(row["duration"])) * 60)
            gpus.append(int(row["num_gpu"]))
    return durations, gpus


USED_OF_RESERVED = 0.257  # published: GPU time used / GPU time reserved
MEDIAN_BUSY = 0.14  # published: the median session's GPU-busy share


def make_sessions(n: int, seed: int = 1, active: tuple[float, float] | None = None) -> list[Session]:
    """`active`: median and sigma of the active share of the lifetime (default: calibrated)."""
    durations, gpus = load_cells()
    f_median, f_sigma = calibrate(seed) if active is None else active
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        lifetime = min(72 * 3600, rng.lognormvariate(math.log(21 * 3600), 0.9))
        active_s = lifetime * min(1.0, rng.lognormvariate(math.log(f_median), f_sigma))
        start_tod = rng.uniform(WORK_START, 16 * 3600)
        t, cells = 0.0, []
        while t < active_s:
            if not at_work(start_tod + t):  # gone home: the next cell comes next morning
                t += next_morning(start_tod + t) + rng.expovariate(1 / 1800)
                continue
            d = min(rng.choice(durations), lifetime - t)
            cells.append((t, t + d))
            t += d + rng.lognormvariate(GAP_MU, GAP_SIGMA)
        cells = [(a, b) for a, b in cells if a < lifetime]
        out.append(
            Session(gpus=rng.choice(gpus), lifetime_s=lifetime, cells=tuple(cells), start_tod=start_tod)
        )
    return out


def used_of_reserved(sessions: list[Session]) -> float:
    """GPU time used / GPU time reserved when every session holds its GPUs for its lifetime."""
    return sum(s.busy_s * s.gpus for s in sessions) / sum(s.lifetime_s * s.gpus for s in sessions)


def median_busy(sessions: list[Session]) -> float:
    return statistics.median(s.busy_s / s.lifetime_s for s in sessions)


@functools.cache
def calibrate(seed: int = 1, n: int = 800) -> tuple[float, float]:
    """Median and sigma of the active share f that reproduce both published figures, by nested
    bisection on sessions of another seed: for a sigma, the median f that gives the median
    session's busy share; then the sigma that gives the aggregate used/reserved."""

    def median_for(sigma: float) -> float:
        lo, hi = 0.005, 1.0
        for _ in range(14):
            mid = (lo + hi) / 2
            if median_busy(make_sessions(n, seed + 10_000, (mid, sigma))) < MEDIAN_BUSY:
                lo = mid
            else:
                hi = mid
        return (lo + hi) / 2

    lo, hi = 0.05, 3.0
    for _ in range(12):
        sigma = (lo + hi) / 2
        if used_of_reserved(make_sessions(n, seed + 10_000, (median_for(sigma), sigma))) < USED_OF_RESERVED:
            lo = sigma
        else:
            hi = sigma
    sigma = (lo + hi) / 2
    return median_for(sigma), sigma
