"""Placement on Alibaba's GPU-sharing trace (the FGD paper's protocol), and decision latency.

    python -m benchmarks.placement [--seeds 3] [--jobs 2] [--plot docs/placement-margin.png] [--skip-scale]

For every workload — 15 mixes resampled from the openb `default` trace by class shares
(benchmarks/placement/mixes.py) and the five shared openb variants — the default policy,
`fgd` and `best-fit` run the FGD protocol with the same seeds; the table gives allocation at
130 % arrived, the margin of the default over the better of the two, and for the shared
variants the FGD authors' published mean. Then the worst margin, the wall time of one seed
of the default policy, and placement latency at 1k/10k/100k GPUs.
"""

from __future__ import annotations

import argparse
import csv
import statistics
import sys
import time

from gpupool.pool.placement import DEFAULT_POLICY

from benchmarks.data import shared_data
from benchmarks.placement import robustness
from benchmarks.placement.mixes import MIX_SEED, grid
from benchmarks.placement.scale import scale_table


def published_fgd(level: int = robustness.LEVEL) -> dict[str, float]:
    """The FGD authors' mean allocation at `level` % arrived, per shared variant."""
    out = {}
    with open(shared_data("openb", "fgd_published_alloc_summary.csv")) as f:
        for row in csv.DictReader(f):
            if row["sc_policy"] == "06-FGD" and int(row["arrived_gpu_pct"]) == level:
                out[row["workload"].removeprefix("openb_pod_list_")] = float(row["alloc_ratio_mean_pct"])
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.placement", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", type=int, default=3, help="protocol seeds per policy, from 42 (default 3)")
    ap.add_argument("--jobs", type=int, default=1, help="processes to run in parallel (default 1)")
    ap.add_argument("--mixes", choices=["all", "none"], default="all", help="run the resampled mixes (default all)")
    ap.add_argument("--variants", default=",".join(robustness.VARIANTS),
                    help="shared openb variants, comma-separated ('' for none)")
    ap.add_argument("--plot", metavar="PNG", help="write a bar chart of the margins (needs matplotlib)")
    ap.add_argument("--skip-scale", action="store_true", help="leave out the decision-latency table")
    args = ap.parse_args(argv)
    if not 1 <= args.seeds <= 10 or not 1 <= args.jobs <= 64:
        ap.error("--seeds must be 1..10 and --jobs 1..64")
    seeds = list(range(42, 42 + args.seeds))
    variants = [v for v in args.variants.split(",") if v]
    unknown = set(variants) - set(robustness.VARIANTS)
    if unknown:
        ap.error(f"unknown variant(s) {sorted(unknown)}; choose from {robustness.VARIANTS}")
    loads = robustness.workloads(grid() if args.mixes == "all" else [], variants)

    def progress(done: int, total: int) -> None:
        print(f"\r{done}/{total} runs", end="", file=sys.stderr, flush=True)

    t0 = time.perf_counter()
    rows = robustness.run(loads, seeds, args.jobs, progress)
    print(file=sys.stderr)
    print(f"GPU allocated (% of the 6,212 GPUs of openb's GPU nodes) at {robustness.LEVEL} % arrived, mean of seeds"
          f" {seeds}; mixes resampled from `default` with seed {MIX_SEED}; margin = default ({DEFAULT_POLICY})"
          " − max(fgd, best-fit), same run")
    print(robustness.table(rows, published_fgd()))
    worst = min(rows, key=lambda r: r.margin)
    print(f"\nworst margin: {worst.margin:+.2f} points on {worst.workload.label}")
    pub = published_fgd()
    above = [r.alloc[DEFAULT_POLICY] - pub[r.workload.label] for r in rows if r.workload.label in pub]
    if above:
        print(f"default − published FGD on the shared variants: min {min(above):+.2f}, mean"
              f" {statistics.mean(above):+.2f}")
    walls = [w for r in rows for w in r.walls[DEFAULT_POLICY]]
    print(f"one seed of the full protocol, default policy, over all workloads: median {statistics.median(walls):.2f} s,"
          f" max {max(walls):.2f} s (target <= 10 s); in the same run fgd median"
          f" {statistics.median(w for r in rows for w in r.walls['fgd']):.2f} s, best-fit median"
          f" {statistics.median(w for r in rows for w in r.walls['best-fit']):.2f} s;"
          f" {args.jobs} process(es), whole benchmark {time.perf_counter() - t0:.0f} s")
    if args.plot:
        print(f"plot: {args.plot}" if robustness.plot(rows, args.plot) else "plot skipped: matplotlib not installed")
    if not args.skip_scale:
        print()
        print(scale_table())
    return 0


if __name__ == "__main__":
    sys.exit(main())
