"""How good is "when will it start"? The Philly workload of benchmarks.quota, replayed.

    python -m benchmarks.eta [--days 3] [--seed 1] [--model open|closed] [--every-min 60]

The quota benchmark's replay (benchmarks/quota/simulate.py: the same pure scheduler the hub
runs, a pass every 5 minutes, guaranteed quotas with reclaim) runs the workload; every
`--every-min` minutes of simulated time, each job then waiting for its first start gets two
estimates of when it starts, from what the hub would know at that moment:

* gpupool's (`gpupool.pool.eta.forecast`): the scheduler replayed forward over the running
  jobs' expected ends, expected run times from the history of runs finished so far, per project,
  and the jobs expected to arrive (`expected_arrivals`: the last hour's submissions repeated);
* the naive one: its position in the queue (by submit time, 1 = next) x the mean run time of the
  runs finished so far.

When the job really starts, each estimate's absolute error is recorded. Jobs that never start
within the replay are left out of both (the same jobs for both). Printed: median and p90
absolute error of each, and whether gpupool's median is at most half the fair one (the target):
the naive estimate / the jobs running at that moment (the naive one assumes one job at a time).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

from benchmarks.quota.simulate import simulate
from benchmarks.quota.workload import Bursts, load
from gpupool.pool import get_policy
from gpupool.pool.eta import ARRIVAL_REPEATS, ARRIVAL_WINDOW_S, Runtimes, expected_arrivals, forecast

HORIZON_S = 3 * 86400.0  # estimates beyond this count as this far out


def nearest_rank(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[max(0, min(len(ordered) - 1, int(round(q / 100 * len(ordered) + 0.5)) - 1))]


class Observer:
    """Called after every scheduling pass of the replay; makes both estimates every `every_s`."""

    def __init__(
        self,
        every_s: float,
        max_cycles: int,
        window_s: float = ARRIVAL_WINDOW_S,
        repeats: int = ARRIVAL_REPEATS,
    ) -> None:
        self.every_s, self.max_cycles = every_s, max_cycles
        self.window_s, self.repeats = window_s, repeats
        self.next_at = every_s
        self.policy = get_policy("best-fit")
        # (job id, made at, gpupool's estimate, naive estimate, naive estimate / running jobs)
        self.estimates: list[tuple[str, float, float, float, float]] = []
        self.forecasts = 0
        self.finished: list = []
        self.forecast_s = 0.0

    def __call__(self, now, state, projects, pending, running, stopping, as_job, jobs) -> None:
        if now < self.next_at:
            return
        # the runs finished by now: what the hub's history would hold
        self.finished = [j for j in jobs if j.finished is not None and j.finished <= now]
        self.next_at = now + self.every_s
        waiting = [j for j in pending.values() if j.first_start is None]
        if not waiting:
            return
        history: dict[str, list[float]] = {}
        for j in self.finished:
            history.setdefault(j.project, []).append(j.work)
        runtimes = Runtimes.of(history)
        t0 = time.perf_counter()
        # what the hub has seen submitted (the open workload's list holds future jobs too)
        seen = [as_job(j) for j in jobs if j.submitted <= now]
        coming = expected_arrivals(seen, now, self.window_s, self.repeats)
        est = forecast(
            state,
            projects,
            [as_job(j) for j in pending.values()],
            [as_job(j) for j in running.values()],
            now,
            self.policy,
            runtimes,
            stopping=[as_job(j) for j in stopping],
            requeued=[j.id for j in stopping],
            horizon_s=HORIZON_S,
            max_cycles=self.max_cycles,
            done={j.id: j.done for j in [*pending.values(), *running.values()]},
            arrivals=coming,
        )
        self.forecast_s += time.perf_counter() - t0
        self.forecasts += 1
        mean_run = statistics.mean(j.work for j in self.finished) if self.finished else 3600.0
        queue = sorted(pending.values(), key=lambda j: (j.submitted, j.id))
        position = {j.id: k + 1 for k, j in enumerate(queue)}
        lanes = max(1, len(running))  # jobs served at once: the queue drains that many at a time
        for j in waiting:
            ours = est[j.id].start
            self.estimates.append(
                (
                    j.id,
                    now,
                    ours if ours is not None else now + HORIZON_S,
                    now + position[j.id] * mean_run,
                    now + position[j.id] * mean_run / lanes,
                )
            )


def run(
    days: float,
    seeds: list[int],
    model: str,
    every_s: float,
    max_cycles: int,
    window_s: float = ARRIVAL_WINDOW_S,
    repeats: int = ARRIVAL_REPEATS,
) -> dict:
    """Every seed's replay of one arrival model; errors pooled over the seeds."""
    ours, naive, lanes = [], [], []
    jobs = never = forecasts = 0
    forecast_s = 0.0
    for seed in seeds:
        print(f"replaying {model} arrivals, seed {seed}...", file=sys.stderr, flush=True)
        obs = Observer(every_s, max_cycles, window_s, repeats)
        res = simulate(load(days, seed, model, Bursts()), static=False, observe=obs)
        started = {j.id: j.first_start for j in res.jobs if j.first_start is not None}
        for job_id, _, e_ours, e_naive, e_lanes in obs.estimates:
            if job_id in started:
                ours.append(abs(e_ours - started[job_id]))
                naive.append(abs(e_naive - started[job_id]))
                lanes.append(abs(e_lanes - started[job_id]))
        jobs += len({e[0] for e in obs.estimates})
        never += len({e[0] for e in obs.estimates if e[0] not in started})
        forecasts += obs.forecasts
        forecast_s += obs.forecast_s
    nan = float("nan")
    return {
        "model": model,
        "pairs": len(ours),
        "jobs": jobs,
        "never_started": never,
        "ours_p50": statistics.median(ours) if ours else nan,
        "ours_p90": nearest_rank(ours, 90) if ours else nan,
        "naive_p50": statistics.median(naive) if naive else nan,
        "naive_p90": nearest_rank(naive, 90) if naive else nan,
        "lanes_p50": statistics.median(lanes) if lanes else nan,
        "lanes_p90": nearest_rank(lanes, 90) if lanes else nan,
        "forecasts": forecasts,
        "forecast_ms": 1000 * forecast_s / max(1, forecasts),
    }


def verdict_line(rows: list[dict]) -> str:
    """The benchmark's last line. The target is against the fair baseline (queue position x mean
    run time / jobs running, #41), not the naive one that assumes one job runs at a time: gpupool's
    median error at most half the fair baseline's, on every arrival model replayed."""
    met = all(r["ours_p50"] <= r["lanes_p50"] / 2 for r in rows)
    per = "; ".join(
        f"{r['model']} {minutes(r['ours_p50'])} vs {minutes(r['lanes_p50'])}"
        f" ({r['ours_p50'] / r['lanes_p50']:.2f}x; naive {minutes(r['naive_p50'])})"
        for r in rows
    )
    return (
        f"VERDICT eta: median abs error gpupool vs fair baseline (position x mean run time / jobs running): {per};"
        f" target <= 0.5x the fair baseline on each: {'met' if met else 'NOT met'}"
    )


def minutes(s: float) -> str:
    return f"{s / 60:.0f} min" if s < 5400 else f"{s / 3600:.1f} h"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m benchmarks.eta",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("--days", type=float, default=3.0)
    ap.add_argument("--seeds", default="1,2,3", help="workload seeds; errors pooled over them")
    ap.add_argument("--model", choices=("open", "closed", "both"), default="both")
    ap.add_argument("--every-min", type=float, default=60.0, help="minutes between estimates")
    ap.add_argument("--max-cycles", type=int, default=400, help="scheduling passes one estimate may replay")
    ap.add_argument(
        "--arrival-window-min",
        type=float,
        default=ARRIVAL_WINDOW_S / 60,
        help="the recent past the forecast expects to repeat, in minutes",
    )
    ap.add_argument(
        "--arrival-repeats",
        type=int,
        default=ARRIVAL_REPEATS,
        help="windows ahead it repeats for (0: no expected arrivals, the forecast before #41)",
    )
    args = ap.parse_args(argv)
    try:
        seeds = [int(x) for x in args.seeds.split(",") if x.strip()]
    except ValueError:
        ap.error(f"--seeds must be whole numbers separated by commas, got {args.seeds!r}")
    if args.arrival_window_min <= 0 or args.arrival_repeats < 0:
        ap.error("--arrival-window-min must be more than 0 and --arrival-repeats at least 0")
    if args.days <= 0 or args.every_min <= 0 or args.max_cycles <= 0 or not seeds:
        ap.error("--days, --every-min and --max-cycles must be more than 0, and --seeds not empty")
    rows = [
        run(
            args.days,
            seeds,
            model,
            args.every_min * 60,
            args.max_cycles,
            args.arrival_window_min * 60,
            args.arrival_repeats,
        )
        for model in (("open", "closed") if args.model == "both" else (args.model,))
    ]
    rows = [r for r in rows if r["pairs"]] or rows  # an arrival model where no job ever waited says nothing
    print(
        f"\nPhilly workload of benchmarks.quota, {args.days:g} days, seeds {', '.join(map(str, seeds))}, an"
        f" estimate for every waiting job every {args.every_min:g} min\n"
    )
    print(
        "| arrivals | estimates (jobs; never started) | gpupool: median / p90 abs. error |"
        " naive (queue position x mean run time): median / p90 | gpupool / naive (median) |"
        " naive / jobs running: median / p90 | one forecast |"
    )
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['model']} | {r['pairs']} ({r['jobs']}; {r['never_started']}) |"
            f" {minutes(r['ours_p50'])} / {minutes(r['ours_p90'])} |"
            f" {minutes(r['naive_p50'])} / {minutes(r['naive_p90'])} | {r['ours_p50'] / r['naive_p50']:.2f} |"
            f" {minutes(r['lanes_p50'])} / {minutes(r['lanes_p90'])} | {r['forecast_ms']:.0f} ms |"
        )
    print(verdict_line(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
