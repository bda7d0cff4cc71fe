"""Every world over a range of demand and seeds: one calibrated point is one draw, and utilization is
not smooth in the demand (a burst more or less in the week moves it by points), so the headline is
each world's range and minimum over the sweep, not the figure at the calibration.

Demand is the mean quiet time between a team's training bursts: each seed's calibrated quiet time
(benchmarks.cluster.__main__.calibrate) times each factor; a smaller factor is more training demand.
"""

from __future__ import annotations

import statistics
import sys
from collections.abc import Callable
from dataclasses import dataclass

from benchmarks.cluster.replay import Metrics
from benchmarks.cluster.world import World

FACTORS = (0.5, 0.71, 1.0, 1.41, 2.0)  # log-symmetric around the calibration
WORLDS = ("static", "kai", "pooled", "parking")


@dataclass(frozen=True)
class Point:
    seed: int
    quiet_h: float
    results: dict[str, Metrics]

    def ratio(self, key: str, base: str) -> float:
        return self.results[key].experiments_per_gpu_hour / self.results[base].experiments_per_gpu_hour


def measure(
    seeds: tuple[int, ...],
    calibrate: Callable[[int], float],
    build: Callable[[int, float], World],
    run: Callable[[World, str], Metrics],
    factors: tuple[float, ...] = FACTORS,
) -> list[Point]:
    points = []
    for seed in seeds:
        quiet = calibrate(seed)
        for f in factors:
            q = round(quiet * f, 1)
            w = build(seed, q)
            print(f"  sweep: seed {seed}, quiet {q:.1f} h", file=sys.stderr, flush=True)
            points.append(Point(seed, q, {k: run(w, k) for k in WORLDS}))
    return points


def span(values: list[float], fmt: str = "{:.1f}") -> str:
    return f"{fmt.format(min(values))} / {fmt.format(statistics.median(values))} / {fmt.format(max(values))}"


def table(points: list[Point], names: dict[str, str]) -> str:
    """Per world: min / median / max over every (seed, demand) point."""
    lines = [
        "| world | GPU utilization of capacity, min / median / max | experiments per GPU-h vs (a) |"
        " vs (k) z2jh + KAI | lost kernel states per week | running cells stopped per week |"
        " notebook wait p99 (worst point) |",
        "|---|---|---|---|---|---|---|",
    ]
    for key in WORLDS:
        util = [100 * p.results[key].utilization for p in points]
        lost = [float(p.results[key].lost_states) for p in points]
        killed = [float(p.results[key].killed_cells) for p in points]
        waits = [_p99(p.results[key].waits) / 60 for p in points]
        lines.append(
            f"| {names[key]} | {span(util)} % | {span([p.ratio(key, 'static') for p in points], '{:.2f}')}×"
            f" | {span([p.ratio(key, 'kai') for p in points], '{:.2f}')}× | {span(lost, '{:.0f}')}"
            f" | {span(killed, '{:.0f}')}"
            f" | {max(waits):.0f} min |"
        )
    return "\n".join(lines)


def points_table(points: list[Point]) -> str:
    lines = [
        "| seed | quiet h | (a) | (k) | (b) | (c) | (c) − (k) | lost kernels (k) / (c) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for p in points:
        u = {k: 100 * m.utilization for k, m in p.results.items()}
        lines.append(
            f"| {p.seed} | {p.quiet_h:.1f} | {u['static']:.1f} % | {u['kai']:.1f} % | {u['pooled']:.1f} %"
            f" | {u['parking']:.1f} % | {u['parking'] - u['kai']:+.1f} |"
            f" {p.results['kai'].lost_states} / {p.results['parking'].lost_states} |"
        )
    return "\n".join(lines)


def verdict(points: list[Point], target: float = 70.0, start: float = 28.0, near: float = 5.0) -> str:
    """The target is the seeds' picture, an organisation from ~28 % to over 70 %: it is judged at
    every point where (a) static reads start ± near %. At other demands utilization follows the demand
    (little training, little use), so there the line gives ranges and (c) against (k)."""
    c = [100 * p.results["parking"].utilization for p in points]
    k = [100 * p.results["kai"].utilization for p in points]
    at = [p for p in points if abs(100 * p.results["static"].utilization - start) <= near]
    c_at = [100 * p.results["parking"].utilization for p in at]
    k_at = [100 * p.results["kai"].utilization for p in at]
    met = sum(x >= target for x in c_at)
    gain = [p.ratio("parking", "kai") for p in points]
    tie = " (a tie)" if min(gain) <= 1.0 <= max(gain) else ""
    lost_k = [p.results["kai"].lost_states for p in points]
    killed_c = max(p.results["parking"].killed_cells for p in points)
    killed_k = [p.results["kai"].killed_cells for p in points]
    wait_c = max(_p99(p.results["parking"].waits) for p in points) / 60
    wait_k = max(_p99(p.results["kai"].waits) for p in points) / 60
    seeds = len({p.seed for p in points})
    judged = (
        f"where (a) static is {start:.0f} ± {near:.0f} % ({len(at)} points): (c) min {min(c_at):.1f} % vs (k) min"
        f" {min(k_at):.1f} %, target (c) >= {target:.0f} %: {'met' if met == len(at) else 'missed'}"
        f" ({met} of {len(at)} met)"
        if at
        else f"no point has (a) static at {start:.0f} ± {near:.0f} %: target not judged"
    )
    return (
        f"cluster sweep ({len(points) // seeds} demands x {seeds} seeds): (c) gpupool + parking utilization"
        f" {min(c):.1f}-{max(c):.1f} %, (k) z2jh + KAI {min(k):.1f}-{max(k):.1f} %; {judged};"
        f" (c)/(k) experiments per GPU-h {min(gain):.2f}-{max(gain):.2f}x{tie}; lost kernel states per week"
        f" (c) {max(p.results['parking'].lost_states for p in points)} at most vs (k) {min(lost_k)}-{max(lost_k)};"
        f" running cells stopped (c) {killed_c} at most vs (k) {min(killed_k)}-{max(killed_k)};"
        f" notebook wait p99 at the worst point (c) {wait_c:.0f} min vs (k) {wait_k:.0f} min"
    )


def _p99(values: list[float]) -> float:
    if not values:
        return 0.0
    values = sorted(values)
    return values[min(len(values) - 1, int(0.99 * len(values)))]
