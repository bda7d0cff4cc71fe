"""Kubernetes mode at a university's scale on the real control plane of tests/cluster
(kube-apiserver, etcd, the Job controller, kube-scheduler standing in for KAI, kwok GPU nodes),
each figure of gpupool next to a baseline measured in the same run on the same plane:

    python -m benchmarks.kube [--nodes 1000] [--jobs 2000] [--users 500] [--gpus 100000]
        everything below in one process, as one hub holds it: the train Jobs are followed while
        the workspaces spawn, so the memory figure counts both; the last line gives each ratio
        and whether its target (issue #26) is met;
    python -m benchmarks.kube jobs [--nodes 1000] [--jobs 2000]
        submit rate (gpupool's controller vs bare create_namespaced_job), the lag from a pod
        change to the job row, from a container's exit and from KAI's eviction (vs a bare pod
        watch), the process's memory following the jobs, the train GPU-hours the hub's usage
        relist recorded (across a restart while pods are evicted) vs the pods' true lives;
    python -m benchmarks.kube eta [--eta-nodes 4] [--seeds 1 2 3]
        KAI-Scheduler's real scheduler on a small cluster of its own, jobs queued in three project
        queues (far more GPUs asked than there are): the hub's forecast of KAI's order against
        when each waiting job really starts, next to the fair baseline (benchmarks.eta's);
    python -m benchmarks.kube workspaces [--nodes 1000] [--users 500]
        spawn throughput (GPUKubeSpawner vs KubeSpawner alone vs bare pod creates of the same
        pod), one culler sampling pass over the pods through one node agent per node, memory;
    python -m benchmarks.kube placement [--gpus 100000]
        a placement decision on a 70 % full cluster, the hub's kept state vs a fresh scan (no plane).

Each run starts its own plane (Go builds as for the tests); at full size the whole run takes
about a quarter of an hour on a small machine. Not a test: nothing is asserted.
"""

from __future__ import annotations

import argparse
import asyncio
import sys

from benchmarks.kube.common import pct, plane_with_nodes

SPAWN_RATIO = 0.8  # spawns/s of GPUKubeSpawner over bare pod creates, at least
CPU_RATIO = 1.2  # CPU per spawn of GPUKubeSpawner over KubeSpawner alone, at most (#41)
EXIT_P50_S, EXIT_P99_S = 1.0, 5.0  # container exit -> job row, at most
MEMORY_MIB = 250  # the process following the Jobs and workspaces, at most
PLACEMENT_P99_MS = 5.0  # one decision at 100,000 GPUs, at most


def verdict(j: dict | None, w: dict | None, p: dict | None, e: dict | None = None) -> str:
    """One line: each figure beside its baseline as a ratio, and whether its target is met."""
    parts = []
    ok = lambda good: "met" if good else "NOT met"  # noqa: E731
    if w is not None:
        from benchmarks.kube.workspaces import cpu_ratio

        ratio = w["spawn_ours_rate"] / w["spawn_bare_rate"]
        parts.append(
            f"spawns {ratio:.2f}x bare pod creates ({w['spawn_ours_rate'] / w['spawn_stock_rate']:.2f}x"
            f" KubeSpawner alone; target >= {SPAWN_RATIO}x: {ok(ratio >= SPAWN_RATIO)})"
        )
        med, lo, hi = cpu_ratio(w)
        parts.append(
            f"CPU per spawn {w['spawn_ours_cpu_ms']:.1f} ms = {med:.2f}x KubeSpawner alone's"
            f" {w['spawn_stock_cpu_ms']:.1f} ms (median of {len(w['cpu_ratio_rounds'])} rounds,"
            f" {lo:.2f}-{hi:.2f}; target <= {CPU_RATIO}x: {ok(med <= CPU_RATIO)})"
        )
    if j is not None:
        o, b = j["lag_exit_ours"], j["lag_exit_bare"]
        good = pct(o, 50) <= EXIT_P50_S and pct(o, 99) <= EXIT_P99_S and j["exited"][0] == j["exited"][1]
        parts.append(
            f"exit seen p50 {pct(o, 50):.2f} s / p99 {pct(o, 99):.2f} s = {pct(o, 50) / max(pct(b, 50), 1e-3):.0f}x"
            f" the bare pod watch's p50 (target <= {EXIT_P50_S:g} / {EXIT_P99_S:g} s: {ok(good)}),"
            f" preemptions seen {j['preempted'][0]} of {j['preempted'][1]}"
            f" ({ok(j['preempted'][0] == j['preempted'][1])})"
        )
        rss = j.get("rss_all", j["rss_jobs"])
        what = "Jobs and workspaces" if "rss_all" in j else "Jobs"
        parts.append(
            f"memory following the {what} {rss:.0f} MiB = {rss / j['rss_start']:.2f}x the process at start"
            f" (target <= {MEMORY_MIB} MiB: {ok(rss <= MEMORY_MIB)})"
        )
    if e is not None:
        from benchmarks.kube.eta import line

        parts.append(line(e))
    if p is not None:
        from benchmarks.kube.placement import p as ms

        cpu, wall, scan = ms(p["ours_cpu"], 99), ms(p["ours_wall"], 99), ms(p["scan_cpu"], 99)
        parts.append(
            f"placement p99 at {p['gpus']:,} GPUs {cpu:.1f} ms CPU ({wall:.1f} ms wall) = {cpu / scan:.2f}x a fresh"
            f" scan's, {p['different']} decisions differ (target <= {PLACEMENT_P99_MS:g} ms:"
            f" {ok(cpu <= PLACEMENT_P99_MS and not p['different'])})"
        )
    return "kube: " + "; ".join(parts)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "run", nargs="?", default="all", choices=["all", "jobs", "eta", "workspaces", "placement"]
    )
    ap.add_argument("--nodes", type=int, default=1000, help="kwok nodes of 8 GPUs")
    ap.add_argument("--jobs", type=int, default=2000, help="train jobs submitted through gpupool")
    ap.add_argument("--bare-jobs", type=int, default=200, help="bare Job creates timed as the baseline")
    ap.add_argument("--exits", type=int, default=100, help="pods ended (paced, 5/s) to time exit -> row")
    ap.add_argument("--preempts", type=int, default=20, help="running pods evicted as KAI does (paced, 5/s)")
    ap.add_argument("--wait", type=float, default=300, help="seconds to wait for every pod to run")
    ap.add_argument("--users", type=int, default=500, help="users, one 0.25-GPU workspace each")
    ap.add_argument("--eta-nodes", type=int, default=4, help="kwok nodes of 8 GPUs of the ETA run (KAI)")
    ap.add_argument(
        "--seeds", type=int, nargs="+", default=[1, 2, 3], help="the ETA run's jobs and run times"
    )
    ap.add_argument("--gpus", type=int, default=100_000, help="GPUs of the placement run (8 per node)")
    args = ap.parse_args(argv)
    if not 1 <= args.nodes <= 5000 or not 8 <= args.gpus <= 1_000_000:
        ap.error("--nodes must be 1..5000 and --gpus 8..1000000")
    if args.run in ("all", "jobs") and args.jobs + args.bare_jobs > args.nodes * 8:
        ap.error("every job needs a GPU: --nodes * 8 must be at least --jobs + --bare-jobs")
    j = w = p = e = None
    if args.run in ("all", "jobs", "workspaces"):
        from benchmarks.kube import jobs as jobs_mod
        from benchmarks.kube import workspaces as ws_mod

        async def go(plane) -> tuple[dict | None, dict | None]:
            if args.run == "workspaces":
                return None, await ws_mod.run(plane, args.nodes, args.users)
            found: dict = {}

            async def workspaces() -> dict:
                found["w"] = await ws_mod.run(plane, args.nodes, args.users)
                return {"rss_all": found["w"]["rss_after"]}

            jr = await jobs_mod.run(
                plane,
                args.jobs,
                min(args.bare_jobs, args.jobs),
                args.exits,
                args.wait,
                args.preempts,
                then=workspaces if args.run == "all" else None,
            )
            return jr, found.get("w")

        with plane_with_nodes(args.nodes) as plane:
            j, w = asyncio.run(go(plane))
        if j is not None:
            jobs_mod.report(j)
        if w is not None:
            ws_mod.report(w)
    if args.run in ("all", "eta"):
        # a plane of its own: KAI's scheduler replaces kube-scheduler's stand-in, and a small
        # cluster lets jobs wait for each other within minutes
        from benchmarks.kube import eta

        with plane_with_nodes(args.eta_nodes) as plane:
            e = asyncio.run(eta.run(plane, args.eta_nodes, args.seeds))
        eta.report(e)
        if j is not None:
            from benchmarks.kube import accounting

            print(accounting.line(*j["accounting"]) + "; " + eta.line(e))
    if args.run in ("all", "placement"):
        # after the hub's part: its 100,000 GPUs (12x the plane's) are no part of what a hub of
        # --nodes holds, and what it freed stayed in this process (16 MiB) under the memory figure
        from benchmarks.kube import placement

        p = placement.run(args.gpus)
        placement.report(p)
    print(verdict(j, w, p, e))
    return 0


if __name__ == "__main__":
    sys.exit(main())
