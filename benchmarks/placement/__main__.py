"""Placement on Alibaba's GPU-sharing trace (the FGD paper's protocol), and decision latency.

    python -m benchmarks.placement [--seeds 3] [--variants default,gpushare40,...] [--skip-scale]

Prints, per openb variant, our policies next to the FGD authors' published means at 100 %
and 130 % arrived, the wall time of one seed, then placement latency at 1k/10k/100k GPUs.
"""

from __future__ import annotations

import argparse
import csv
import statistics
import sys

from gpupool.sim import fgd
from gpupool.sim.traces import read_nodes, read_pods

from benchmarks.data import shared_data
from benchmarks.placement.scale import scale_table

VARIANTS = ["default", "gpushare40", "multigpu20", "cpu050", "gpuspec10"]
OURS = {"frag-aware": "gpupool frag-aware (default)", "fgd": "gpupool fgd (FGD as published, learned online)",
        "best-fit": "gpupool best-fit", "random": "gpupool random"}
PUBLISHED = {"06-FGD": "FGD (published)", "05-BestFit": "BestFit (published)", "01-Random": "Random (published)"}


def published(variant: str) -> dict[tuple[str, int], float]:
    out = {}
    with open(shared_data("openb", "fgd_published_alloc_summary.csv")) as f:
        for row in csv.DictReader(f):
            if row["workload"] == f"openb_pod_list_{variant}":
                out[(row["sc_policy"], int(row["arrived_gpu_pct"]))] = float(row["alloc_ratio_mean_pct"])
    return out


def at(result: dict, level: int) -> float:
    levels = result["arrived_pct"]
    return result["alloc_ratio_pct"][levels.index(level)] if level in levels else float("nan")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.placement", description=__doc__)
    ap.add_argument("--seeds", type=int, default=3, help="seeds per policy, from 42 (default 3)")
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--skip-scale", action="store_true")
    args = ap.parse_args(argv)
    inventory = read_nodes(shared_data("openb", "openb_node_list_gpu_node.csv"))
    seeds = list(range(42, 42 + args.seeds))
    walls: list[float] = []
    print(f"allocation (% of {inventory.gpu_count} GPUs) at 100 % and 130 % arrived; ours: mean of seeds {seeds}")
    print("| variant | policy | 100 % | 130 % | unallocated GPUs at 130 % | vs FGD at 130 % |")
    print("|---|---|---|---|---|---|")
    for variant in args.variants.split(","):
        pods = read_pods(shared_data("openb", f"openb_pod_list_{variant}.csv"))
        pub = published(variant)
        fgd130 = pub.get(("06-FGD", 130), float("nan"))
        for policy, label in OURS.items():
            results = []
            for seed in seeds:
                print(f"\r{variant} {policy} seed {seed}", end="   ", file=sys.stderr, flush=True)
                results.append(fgd.run(inventory, pods, policy, seed))
            if policy == "frag-aware" and variant == "default":
                walls += [r["wall_s"] for r in results]
            a100 = statistics.mean(at(r, 100) for r in results)
            a130 = statistics.mean(at(r, 130) for r in results)
            unalloc = statistics.mean(r["unallocated_gpus"] for r in results)
            print(f"\n| {variant} | {label} | {a100:.2f} | {a130:.2f} | {unalloc:.0f} | {a130 - fgd130:+.2f} |",
                  end="")
        print()
        for key, label in PUBLISHED.items():
            a100, a130 = pub.get((key, 100), float("nan")), pub.get((key, 130), float("nan"))
            gpus = inventory.gpu_count * (1 - a130 / 100)
            print(f"| {variant} | {label} | {a100:.2f} | {a130:.2f} | {gpus:.0f} | {a130 - fgd130:+.2f} |")
    print(file=sys.stderr)
    if walls:
        print(f"\none seed of the full protocol, default trace, frag-aware: median {statistics.median(walls):.2f} s"
              f" (min {min(walls):.2f}, max {max(walls):.2f}); target <= 10 s")
    if not args.skip_scale:
        print()
        print(scale_table())
    return 0


if __name__ == "__main__":
    sys.exit(main())
