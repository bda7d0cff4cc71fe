"""`gpupool simulate`: replay workloads through the pool core the hub uses.

Scenarios:
  fgd      the FGD paper's protocol on the openb trace (Alibaba GPU-sharing cluster)
  replay   time-driven: pods arrive and leave at the trace's creation/deletion times
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from gpupool.pool.placement import DEFAULT_POLICY, POLICIES
from gpupool.sim import fgd, replay
from gpupool.sim.progress import Progress
from gpupool.sim.traces import TraceError, read_nodes, read_pods


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--nodes", required=True, help="nodes CSV (sn,cpu_milli,memory_mib,gpu,model)")
    p.add_argument("--pods", required=True, help="pods CSV (name,cpu_milli,memory_mib,num_gpu,gpu_milli,...)")
    p.add_argument(
        "--policy",
        default=DEFAULT_POLICY,
        choices=sorted(POLICIES),
        help=f"placement policy (default {DEFAULT_POLICY})",
    )
    p.add_argument("--seed", type=int, default=42, help="random seed (the FGD paper uses 42..51)")
    p.add_argument(
        "--json",
        metavar="OUT",
        help="also write the result as JSON to OUT; '-' prints only the JSON (default: a summary)",
    )


def parser() -> argparse.ArgumentParser:
    policies = ", ".join(sorted(POLICIES))
    ap = argparse.ArgumentParser(
        prog="gpupool simulate",
        description=__doc__,
        epilog=f"policies: {policies} (default {DEFAULT_POLICY})",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = ap.add_subparsers(dest="scenario", required=True, metavar="SCENARIO")
    p_fgd = sub.add_parser("fgd", help="the FGD paper's protocol: shuffled trace, inflation, never leave")
    _common(p_fgd)
    p_fgd.add_argument(
        "--inflation",
        type=float,
        default=1.3,
        help="append pods until requested GPU would pass this x capacity (default 1.3)",
    )
    p_rep = sub.add_parser("replay", help="time-driven replay of creation/deletion times")
    _common(p_rep)
    p_rep.add_argument(
        "--queue", action="store_true", help="pods that do not fit wait (FIFO) instead of being rejected"
    )
    return ap


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        inventory = read_nodes(args.nodes)
        pods = read_pods(args.pods)
    except TraceError as err:
        print(f"gpupool simulate: {err}", file=sys.stderr)
        return 2
    progress = Progress(f"{args.scenario} {args.policy} seed {args.seed}")
    try:
        if args.scenario == "fgd":
            if not 0 < args.inflation <= 10:
                print("gpupool simulate: --inflation must be in (0, 10]", file=sys.stderr)
                return 2
            result = fgd.run(inventory, pods, args.policy, args.seed, args.inflation, progress)
        else:
            result = replay.run(inventory, pods, args.policy, args.seed, queue=args.queue, progress=progress)
    except ValueError as err:  # the trace cannot be used for this scenario: say so, no traceback
        print(f"gpupool simulate {args.scenario}: {args.pods}: {err}", file=sys.stderr)
        return 2
    finally:
        progress.close()
    if args.json == "-":
        print(json.dumps(result))
        return 0
    if args.json:
        with open(args.json, "w") as f:
            f.write(json.dumps(result))
    print(summary(args.scenario, result))
    if args.json:
        print(f"  JSON: {args.json}")
    return 0


def summary(scenario: str, result: dict[str, Any]) -> str:
    """The result as a person reads it: what was allocated, what was left, how long it took."""
    head = f"gpupool simulate {scenario}: policy {result['policy']}, seed {result['seed']}, {result['pods']:,} pods"
    if scenario == "fgd" and result.get("alloc_ratio_pct"):
        return "\n".join(
            [
                head,
                f"  GPUs allocated: {result['alloc_ratio_pct'][-1]:.2f} % of capacity when"
                f" {result['arrived_pct'][-1]} % of it had been requested",
                f"  GPUs left unallocated at the end: {result['unallocated_gpus']:,.1f}"
                f" ({result['failed_pods']:,} pods did not fit)",
                f"  wall time: {result['wall_s']:.2f} s",
            ]
        )
    if scenario == "replay":
        return "\n".join(
            [
                head,
                f"  placed {result['placed']:,}, rejected {result['rejected']:,}, still waiting {result['still_waiting']:,}",
                f"  GPU allocation, time average: {result['time_avg_alloc_pct']:.1f} % of capacity",
                f"  fragmented GPUs, time average: {result['time_avg_fragmented_gpus']:.2f}",
                f"  queue delay: p50 {result['queue_delay_p50_s']:.0f} s, p99 {result['queue_delay_p99_s']:.0f} s",
                f"  wall time: {result['wall_s']:.2f} s",
            ]
        )
    return head
