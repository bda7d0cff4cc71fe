"""Guaranteed quotas vs a static partition, on a contended multi-project workload.

    python -m benchmarks.quota [--days 3] [--seeds 1,2,3,4,5] [--model open|closed|both]
                               [--busy-hours 8] [--quiet-hours 16] [--want 2]

The workload (benchmarks/quota/workload.py): Philly's virtual clusters as projects, bursty
demand of about twice a project's guarantee while it is busy, Philly run times; submitted
either as an open Poisson stream or by researchers who wait for each result before the next
experiment (closed loop). Both policies are the same pure scheduler
(gpupool.pool.training.schedule), a pass every 5 minutes:
  (a) static partition: each project may use its guarantee and never more;
  (b) gpupool: guaranteed quotas, idle GPUs lent by weight, over-quota jobs preempted (60 s
      grace) when a project needs its guarantee back, resuming from their last checkpoint
      (every 30 min);
  (c) the same with reservations: a gang job that waited 30 min gets a node reserved
      (docs/training.md, rule 13), with runs that declare no max runtime;
  (d) the same, each run declaring a max runtime (what it needs, rounded up to the hour).
The large-job table gives the queueing delay of 8-GPU jobs under each (a job still waiting at
the end counts with its wait so far). Then (--pools, first seed) the heterogeneous cluster of
benchmarks/quota/pools.py: flat placement vs two node pools, with each pool's allocation.
"""

from __future__ import annotations

import argparse
import statistics
import sys

from benchmarks.quota.pools import POOLS, heterogeneous, per_pool_guarantees, prefer, split
from benchmarks.quota.simulate import CYCLE, GRACE, Result, simulate
from benchmarks.quota.workload import Bursts, load

RESERVE_AFTER_S = 1800.0
POLICIES = (
    ("static partition", True, None, False),
    ("gpupool guaranteed quotas", False, None, False),
    ("gpupool + reservations", False, RESERVE_AFTER_S, False),
    ("gpupool + reservations, runtimes declared", False, RESERVE_AFTER_S, True),
)
LARGE = 8  # GPUs of a "large" job


def summarize(label: str, res: Result, capacity_gpu_h: float, horizon: float) -> dict:
    done = [j for j in res.jobs if j.finished is not None]
    delays: dict[str, list[float]] = {}
    for j in res.jobs:
        if j.first_start is not None:
            delays.setdefault(j.project, []).append((j.first_start - j.submitted) / 60)
    per_project = {p: (statistics.median(d), sorted(d)[int(0.99 * (len(d) - 1))]) for p, d in delays.items()}
    large = sorted(
        ((j.first_start if j.first_start is not None else horizon) - j.submitted) / 60
        for j in res.jobs
        if j.gpus >= LARGE
    )
    return {
        "label": label,
        "alloc_pct": 100 * statistics.mean(res.alloc_samples),
        "contended_alloc_pct": 100 * statistics.mean(res.contended_alloc)
        if res.contended_alloc
        else float("nan"),
        "submitted": len(res.jobs),
        "completed": len(done),
        "per_gpu_h": len(done) / capacity_gpu_h,
        "lost_gpu_h": res.lost_gpu_s / 3600,
        "preemptions": res.preemptions,
        "moves": res.moves,
        "reclaim_wait_min": max(res.reclaim_waits, default=0.0) / 60,
        "reclaims": len(res.reclaim_waits),
        "in_quota_max_min": max(res.in_quota_waits, default=0.0) / 60,
        "in_quota_late": sum(w > CYCLE + GRACE for w in res.in_quota_waits),
        "in_quota": len(res.in_quota_waits),
        "delays": per_project,
        "large": len(large),
        "large_p50_min": statistics.median(large) if large else 0.0,
        "large_p99_min": large[int(0.99 * (len(large) - 1))] if large else 0.0,
        "large_max_min": large[-1] if large else 0.0,
        "large_unstarted": sum(1 for j in res.jobs if j.gpus >= LARGE and j.first_start is None),
    }


def report(model: str, out: list[dict], projects: list[str]) -> None:
    print(f"\n#### {model} arrivals\n")
    print(
        "| policy | GPU allocation (time avg) | allocation while demand > capacity | jobs submitted | jobs completed |"
        " completed per 1,000 GPU-h | preemptions (consolidation moves) | GPU-h lost to preemption |"
        " guarantee back: longest wait of an in-quota job that needed a reclaim (such jobs) |"
        f" in-quota jobs waiting > cycle + grace ({(CYCLE + GRACE) / 60:.0f} min) |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in out:
        contended = (
            "never"
            if r["contended_alloc_pct"] != r["contended_alloc_pct"]
            else f"{r['contended_alloc_pct']:.1f} %"
        )
        print(
            f"| {r['label']} | {r['alloc_pct']:.1f} % | {contended} | {r['submitted']} |"
            f" {r['completed']} | {1000 * r['per_gpu_h']:.1f} | {r['preemptions']} ({r['moves']}) |"
            f" {r['lost_gpu_h']:.1f} | {r['reclaim_wait_min']:.1f} min ({r['reclaims']}) |"
            f" {r['in_quota_late']} of {r['in_quota']} (longest {r['in_quota_max_min']:.1f} min) |"
        )
    print(
        f"\nratio of jobs completed per GPU-hour, gpupool / static ({model}):"
        f" {out[1]['per_gpu_h'] / out[0]['per_gpu_h']:.2f}"
    )
    print(f"\nqueueing delay of {LARGE}-GPU jobs (minutes)\n")
    print("| policy | jobs | p50 | p99 | longest | never started |")
    print("|---|---|---|---|---|---|")
    for r in out:
        print(
            f"| {r['label']} | {r['large']} | {r['large_p50_min']:.0f} | {r['large_p99_min']:.0f} |"
            f" {r['large_max_min']:.0f} | {r['large_unstarted']} |"
        )
    print("\nqueueing delay p50 / p99 (minutes) per project\n")
    print("| project | static p50 | static p99 | gpupool p50 | gpupool p99 |")
    print("|---|---|---|---|---|")
    for p in projects:
        s, g = out[0]["delays"].get(p, (0, 0)), out[1]["delays"].get(p, (0, 0))
        print(f"| {p} | {s[0]:.0f} | {s[1]:.0f} | {g[0]:.0f} | {g[1]:.0f} |")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m benchmarks.quota",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("--days", type=float, default=3.0)
    ap.add_argument(
        "--seeds", default="1,2,3,4,5", help="workload seeds; tables for the first, ratios for all"
    )
    ap.add_argument("--model", choices=("open", "closed", "both"), default="both")
    ap.add_argument("--busy-hours", type=float, default=8.0, help="mean busy period of a project")
    ap.add_argument("--quiet-hours", type=float, default=16.0, help="mean quiet period of a project")
    ap.add_argument("--want", type=float, default=2.0, help="GPUs a busy project wants, x its guarantee")
    ap.add_argument(
        "--pools",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="also the heterogeneous cluster: flat vs two node pools (first seed)",
    )
    args = ap.parse_args(argv)
    try:
        seeds = [int(s) for s in args.seeds.split(",") if s.strip()]
    except ValueError:
        ap.error(f"--seeds must be whole numbers separated by commas, got {args.seeds!r}")
    if args.days <= 0 or not seeds or min(args.busy_hours, args.quiet_hours, args.want) <= 0:
        ap.error("--days, --busy-hours, --quiet-hours and --want must be more than 0, and --seeds not empty")
    bursts = Bursts(args.busy_hours, args.quiet_hours, args.want)
    summary = []
    for model in ("open", "closed") if args.model == "both" else (args.model,):
        ratios, allocs, large = [], [], []
        for seed in seeds:
            w = load(args.days, seed, model, bursts)
            capacity_gpu_h = w.inventory.gpu_count * w.horizon / 3600
            out = []
            for label, static, reserve_after_s, declared in POLICIES:
                print(f"simulating {label} ({model}, seed {seed})...", file=sys.stderr, flush=True)
                out.append(
                    summarize(
                        label, simulate(w, static, reserve_after_s, declared), capacity_gpu_h, w.horizon
                    )
                )
            if seed == seeds[0]:
                size = f"{len(w.jobs)} jobs" if w.jobs else f"{len(w.streams)} researchers"
                print(
                    f"\n{model}, seed {seed}: {len(w.projects)} projects, {w.inventory.gpu_count} GPUs,"
                    f" {args.days:g} days, {size}"
                )
                report(model, out, list(w.projects))
            ratios.append(out[1]["per_gpu_h"] / out[0]["per_gpu_h"])
            allocs.append(
                (
                    out[0]["alloc_pct"],
                    out[1]["alloc_pct"],
                    out[1]["contended_alloc_pct"],
                    out[1]["in_quota_late"],
                    out[1]["in_quota"],
                )
            )
            large.append([(r["large_p99_min"], r["alloc_pct"]) for r in out[1:]])
        summary.append((model, ratios, allocs, large))
    print(
        f"\n### every seed ({', '.join(map(str, seeds))}): busy {bursts.busy_h:g} h, quiet {bursts.quiet_h:g} h,"
        f" want {bursts.want:g}x the guarantee\n"
    )
    print(
        "| arrivals | allocation static → gpupool | gpupool allocation while demand > capacity |"
        " in-quota jobs waiting > cycle + grace | jobs per GPU-h, gpupool / static | mean ratio |"
    )
    print("|---|---|---|---|---|---|")
    for model, ratios, allocs, _ in summary:
        contended = ", ".join("never contended" if c != c else f"{c:.1f} %" for _, _, c, _, _ in allocs)
        print(
            f"| {model} | {', '.join(f'{a:.0f} → {b:.0f} %' for a, b, *_ in allocs)} | {contended} |"
            f" {', '.join(f'{late} of {n}' for *_, late, n in allocs)} |"
            f" {', '.join(f'{r:.2f}' for r in ratios)} | {statistics.mean(ratios):.2f} |"
        )
    print(
        f"\n{LARGE}-GPU jobs, every seed: queueing delay p99 (minutes) and GPU allocation; reservations"
        f" after {RESERVE_AFTER_S / 60:.0f} min\n"
    )
    print("| arrivals | " + " | ".join(label for label, *_ in POLICIES[1:]) + " |")
    print("|---|" + "---|" * (len(POLICIES) - 1))
    for model, _, _, large in summary:
        cells = [
            ", ".join(f"{seed[k][0]:.0f} min ({seed[k][1]:.0f} %)" for seed in large)
            for k in range(len(POLICIES) - 1)
        ]
        print(f"| {model} | " + " | ".join(cells) + " |")
    if args.pools:
        two_pools(args.days, seeds[0], bursts, args.model)
    return 0


def two_pools(days: float, seed: int, bursts: Bursts, which: str) -> None:
    """The heterogeneous cluster (benchmarks/quota/pools.py): flat vs two node pools."""
    print(f"\n### two pools (seed {seed}): one 8-GPU node in four as four 2-GPU workstations\n")
    print(
        "| arrivals | placement | GPU allocation | workstations | DGX | jobs per 1,000 GPU-h |"
        f" {LARGE}-GPU jobs: wait p50 / p99 / longest (min) | never started | jobs of 1-2 GPUs: wait p99 (min) |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for model in ("open", "closed") if which == "both" else (which,):
        w = heterogeneous(load(days, seed, model, bursts))
        capacity_gpu_h = w.inventory.gpu_count * w.horizon / 3600
        per_pool = per_pool_guarantees(w)
        for label, rule, reserve_after_s, wl in (
            ("flat (no pools)", None, None, w),
            ("two pools, small jobs prefer workstations", prefer, None, w),
            ("two pools, split by job size", split, None, w),
            ("split + reservations", split, RESERVE_AFTER_S, w),
            ("split, guarantees per pool", split, None, per_pool),
            ("split, guarantees per pool + reservations", split, RESERVE_AFTER_S, per_pool),
        ):
            print(f"simulating {label} on two pools ({model})...", file=sys.stderr, flush=True)
            res = simulate(wl, False, reserve_after_s, pools=POOLS, job_pools=rule)
            r = summarize(label, res, capacity_gpu_h, w.horizon)
            ws, dgx = (100 * statistics.mean(res.pool_alloc[p]) for p in ("workstations", "dgx"))
            small = sorted(
                ((j.first_start if j.first_start is not None else w.horizon) - j.submitted) / 60
                for j in res.jobs
                if j.gpus <= 2
            )
            print(
                f"| {model} | {label} | {r['alloc_pct']:.1f} % | {ws:.1f} % | {dgx:.1f} % |"
                f" {1000 * r['per_gpu_h']:.1f} | {r['large_p50_min']:.0f} / {r['large_p99_min']:.0f} /"
                f" {r['large_max_min']:.0f} | {r['large_unstarted']} | {small[int(0.99 * (len(small) - 1))]:.0f} |"
            )


if __name__ == "__main__":
    sys.exit(main())
