"""Guaranteed quotas vs a static partition, on a contended multi-project workload.

    python -m benchmarks.quota [--days 3] [--seed 1]

Projects are Philly's 11 virtual clusters (../shared/data/philly/philly_vc.csv), scaled to 1/8:
a project's guarantee is its share of the GPUs. Run times are drawn from Philly's job run times
(philly_runtime.csv, capped at 24 h). Arrivals are bursty: each project alternates busy periods
(exponential, mean 8 h), when it submits enough to want about twice its guarantee, with quiet
periods (mean 16 h). Jobs take 1, 2, 4 or 8 whole GPUs (50/20/20/10 %) and checkpoint every
30 min. Both policies are the same pure scheduler (hub_ext.pool.training.schedule), one
scheduling cycle every 5 minutes:
  (a) static partition: each project may use its quota and never more;
  (b) gpupool: guaranteed quotas, idle GPUs lent by weight, over-quota jobs preempted (60 s
      grace) when a project needs its guarantee back, resuming from their last checkpoint.
"""

from __future__ import annotations

import argparse
import csv
import heapq
import random
import statistics
import sys
from dataclasses import dataclass, field

from benchmarks.data import shared_data
from hub_ext.pool import ClusterState, Request, get_policy
from hub_ext.pool.inventory import GPU, Inventory, Node
from hub_ext.pool.training import Job, Project, schedule

CYCLE = 300.0
GRACE = 60.0
CHECKPOINT = 1800.0


@dataclass
class SimJob:
    id: str
    project: str
    gpus: int
    work: float  # seconds of run time needed
    submitted: float
    done: float = 0.0  # work saved in checkpoints
    started: float | None = None
    placement: object = None
    finished: float | None = None
    first_start: float | None = None
    needs_reclaim: bool = False


@dataclass
class Result:
    alloc_samples: list[float] = field(default_factory=list)
    contended_alloc: list[float] = field(default_factory=list)
    lost_gpu_s: float = 0.0
    preemptions: int = 0
    reclaim_waits: list[float] = field(default_factory=list)
    moves: int = 0


def load(days: float, seed: int):
    with open(shared_data("philly", "philly_vc.csv")) as f:
        vcs = [(r["vc"], int(r["node num"])) for r in csv.DictReader(f)]
    with open(shared_data("philly", "philly_runtime.csv")) as f:
        runtimes = [min(86400.0, float(r["runtime"])) for r in csv.DictReader(f) if float(r["runtime"]) >= 60]
    rng = random.Random(seed)
    nodes, projects = [], {}
    for vc, n in vcs:
        count = max(1, n // 8)
        for i in range(count):
            nodes.append(Node(f"{vc}-{i}", tuple(GPU(g, f"{vc}-{i}-{g}", "V100", 16000, True) for g in range(8))))
        projects[vc] = Project(vc, guarantee_milli=count * 8 * 1000, weight=1.0)
    inventory = Inventory(nodes=tuple(nodes))
    horizon = days * 86400
    jobs: list[SimJob] = []
    mean_run = statistics.mean(runtimes)
    for vc, p in projects.items():
        t = rng.expovariate(1 / (16 * 3600))
        while t < horizon:
            busy_end = t + rng.expovariate(1 / (8 * 3600))
            # want ~2x the guarantee in GPUs while busy: arrival rate = 2G / (mean GPUs x mean run)
            rate = 2 * (p.guarantee_milli / 1000) / (2.5 * mean_run)
            while t < min(busy_end, horizon):
                t += rng.expovariate(rate)
                gpus = rng.choices([1, 2, 4, 8], [0.5, 0.2, 0.2, 0.1])[0]
                jobs.append(SimJob(f"{vc}-{len(jobs)}", vc, gpus, rng.choice(runtimes), t))
            t = busy_end + rng.expovariate(1 / (16 * 3600))
    return inventory, projects, sorted(jobs, key=lambda j: j.submitted), horizon


def simulate(inventory: Inventory, projects: dict[str, Project], jobs: list[SimJob], horizon: float,
             static: bool) -> tuple[Result, list[SimJob]]:
    if static:
        projects = {n: Project(n, p.guarantee_milli, p.weight, limit_milli=p.guarantee_milli)
                    for n, p in projects.items()}
    jobs = [SimJob(**{**j.__dict__}) for j in jobs]
    state = ClusterState(inventory)
    policy = get_policy("best-fit")
    rng = random.Random(0)
    res = Result()
    arrivals = list(jobs)
    pending: dict[str, SimJob] = {}
    running: dict[str, SimJob] = {}
    stopping: list[tuple[float, str, SimJob]] = []  # (stop time, id, job) during grace
    pins: dict[str, object] = {}
    cap = inventory.capacity_milli
    now = 0.0
    i = 0
    while now < horizon:
        while i < len(arrivals) and arrivals[i].submitted <= now:
            pending[arrivals[i].id] = arrivals[i]
            i += 1
        # finished runs and runs whose grace ended
        for j in list(running.values()):
            if j.done + (now - j.started) >= j.work:
                j.finished = j.started + (j.work - j.done)
                state.release(j.placement)
                del running[j.id]
        while stopping and stopping[0][0] <= now:
            _, _, j = heapq.heappop(stopping)
            state.release(j.placement)
            j.placement = pins.pop(j.id, None)  # a consolidation planned its next spot
            pending[j.id] = j
        for jid, spot in pins.items():
            if jid in pending:
                pending[jid].placement = spot

        def as_job(j: SimJob) -> Job:
            return Job(j.id, j.project, Request.for_gpus(j.gpus * 1000), j.submitted, started=j.started,
                       placement=j.placement)
        plan = schedule(state, projects, [as_job(j) for j in pending.values()], [as_job(j) for j in running.values()],
                        now, policy, rng, stopping=[as_job(j) for _, _, j in stopping])
        stops = [(p.job, p.for_job) for p in plan.preempt]
        for m in plan.move:
            stops.append((m.job, m.for_job))
            pins[m.job], pins[m.for_job] = m.to, m.target
            res.moves += 1
        for job_id, for_job in stops:
            j = running.pop(job_id)
            ran = now - j.started
            saved = (ran // CHECKPOINT) * CHECKPOINT
            res.lost_gpu_s += (ran - saved) * j.gpus
            j.done += saved
            res.preemptions += 1
            j.started = None
            heapq.heappush(stopping, (now + GRACE, j.id, j))
            if for_job in pending:
                pending[for_job].needs_reclaim = True
        for a in plan.admit:
            pins.pop(a.job, None)
            j = pending.pop(a.job)
            state.apply(a.placement)
            j.placement, j.started = a.placement, now
            if j.first_start is None:
                j.first_start = now
                if j.needs_reclaim:
                    res.reclaim_waits.append(now - j.submitted)
            running[j.id] = j
        used = state.used_milli() / cap
        res.alloc_samples.append(used)
        demand = sum(j.gpus for j in pending.values()) * 1000 + state.used_milli()
        if demand > cap:
            res.contended_alloc.append(used)
        now += CYCLE
    return res, jobs


def summarize(label: str, res: Result, jobs: list[SimJob], capacity_gpu_h: float) -> dict:
    done = [j for j in jobs if j.finished is not None]
    delays = {}
    for j in jobs:
        if j.first_start is not None:
            delays.setdefault(j.project, []).append((j.first_start - j.submitted) / 60)
    per_project = {p: (statistics.median(d), sorted(d)[int(0.99 * (len(d) - 1))]) for p, d in delays.items()}
    return {
        "label": label,
        "alloc_pct": 100 * statistics.mean(res.alloc_samples),
        "contended_alloc_pct": 100 * statistics.mean(res.contended_alloc) if res.contended_alloc else float("nan"),
        "completed": len(done),
        "per_gpu_h": len(done) / capacity_gpu_h,
        "lost_gpu_h": res.lost_gpu_s / 3600,
        "preemptions": res.preemptions,
        "moves": res.moves,
        "reclaim_wait_min": max(res.reclaim_waits) / 60 if res.reclaim_waits else 0.0,
        "delays": per_project,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.quota", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--days", type=float, default=3.0)
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args(argv)
    inventory, projects, jobs, horizon = load(args.days, args.seed)
    capacity_gpu_h = inventory.gpu_count * horizon / 3600
    print(f"{len(projects)} projects, {inventory.gpu_count} GPUs, {len(jobs)} jobs over {args.days:g} days", flush=True)
    out = []
    for label, static in (("static partition", True), ("gpupool guaranteed quotas", False)):
        print(f"simulating {label}...", file=sys.stderr, flush=True)
        res, done = simulate(inventory, projects, jobs, horizon, static)
        out.append(summarize(label, res, done, capacity_gpu_h))
    print("| policy | GPU allocation (time avg) | allocation while demand > capacity | jobs completed |"
          " completed per 1,000 GPU-h | preemptions (of which consolidation moves) | GPU-h lost to preemption |"
          " longest wait for a reclaimed guarantee |")
    print("|---|---|---|---|---|---|---|---|")
    for r in out:
        print(f"| {r['label']} | {r['alloc_pct']:.1f} % | {r['contended_alloc_pct']:.1f} % | {r['completed']} |"
              f" {1000 * r['per_gpu_h']:.1f} | {r['preemptions']} ({r['moves']}) | {r['lost_gpu_h']:.1f} | {r['reclaim_wait_min']:.0f} min |")
    print(f"\nratio of jobs completed per GPU-hour, gpupool / static: {out[1]['per_gpu_h'] / out[0]['per_gpu_h']:.2f}")
    print("\nqueueing delay p50 / p99 (minutes) per project")
    print("| project | static p50 | static p99 | gpupool p50 | gpupool p99 |")
    print("|---|---|---|---|---|")
    for p in projects:
        s, g = out[0]["delays"].get(p, (0, 0)), out[1]["delays"].get(p, (0, 0))
        print(f"| {p} | {s[0]:.0f} | {s[1]:.0f} | {g[0]:.0f} | {g[1]:.0f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
