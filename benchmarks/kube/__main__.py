"""Kubernetes mode at scale on the real control plane of tests/cluster (kube-apiserver, etcd,
the Job controller, kube-scheduler standing in for KAI, kwok GPU nodes), each figure of
gpupool next to a baseline measured in the same run on the same plane:

    python -m benchmarks.kube jobs [--nodes 1000] [--jobs 2000]
        submit rate (gpupool's controller vs bare create_namespaced_job), the lag from a pod
        change to the job row (vs a bare pod watch), the process's memory following the jobs;
    python -m benchmarks.kube workspaces [--nodes 1000] [--users 500]
        spawn throughput (GPUKubeSpawner vs bare pod creates of the same pod), one culler
        sampling pass over the pods through one node agent per node (vs the bare GETs), memory.

Each run starts its own plane (Go builds as for the tests) and is sized to end within ~9
minutes on a small machine. Not a test: nothing is asserted.
"""

from __future__ import annotations

import argparse
import asyncio
import sys

from .common import plane_with_nodes


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="run", required=True)
    j = sub.add_parser("jobs", help="train Jobs followed by gpupool's controller")
    j.add_argument("--nodes", type=int, default=1000, help="kwok nodes of 8 GPUs")
    j.add_argument("--jobs", type=int, default=2000, help="train jobs submitted through gpupool")
    j.add_argument("--bare-jobs", type=int, default=200, help="bare Job creates timed as the baseline")
    j.add_argument("--exits", type=int, default=100, help="pods ended (paced, 5/s) to time exit -> row")
    j.add_argument("--wait", type=float, default=300, help="seconds to wait for every pod to run")
    w = sub.add_parser("workspaces", help="workspaces spawned through GPUKubeSpawner, one culler pass")
    w.add_argument("--nodes", type=int, default=1000, help="kwok nodes of 8 GPUs")
    w.add_argument("--users", type=int, default=500, help="users, one 0.25-GPU workspace each")
    args = ap.parse_args(argv)
    if args.run == "jobs":
        from . import jobs as mod

        if args.jobs > args.nodes * 8:
            ap.error("every job needs a GPU: --nodes * 8 must be at least --jobs")
        run = lambda plane: mod.run(plane, args.jobs, min(args.bare_jobs, args.jobs), args.exits, args.wait)  # noqa: E731
    else:
        from . import workspaces as mod

        run = lambda plane: mod.run(plane, args.nodes, args.users)  # noqa: E731
    with plane_with_nodes(args.nodes) as plane:
        result = asyncio.run(run(plane))
    mod.report(result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
