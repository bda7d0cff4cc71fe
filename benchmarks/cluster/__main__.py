"""One cluster shared by notebooks and training, replayed through gpupool's core in three worlds:

    python -m benchmarks.cluster [--seed 1] [--seeds 1,2,3] [--sessions 2000] [--plot docs/images/cluster-utilization.svg]

(a) static: whole GPUs per notebook, held for the session's life; a static partition per team
    for its notebooks and its training;
(k) what a z2jh admin would pick instead: KAI-Scheduler's pooling (a queue per team, its partition
    as deserved quota, idle GPUs lent over quota and reclaimed, a team's notebooks within its
    deserved quota), half-GPU fractions, and z2jh's idle-culler as shipped (60 min without Jupyter
    activity, checked every 10 min, blind to GPU use);
(b) gpupool: one pool, fractions (a 1-GPU notebook gets half a GPU), the culler's default
    rules (GPU idle 30 min + Jupyter quiet 15 min, 4 h hard, 12 h max), guaranteed quotas
    (half of each team's GPUs; idle GPUs lent; build before train);
(c) (b) with parking: idle GPUs parked after 10 min instead of stopped, no session limits;
(d) (c) with moves: idle notebooks moved, make-before-break, so that the head of the queue (an
    in-quota training job, a resume claim) can start (benchmarks/cluster/moves.py).

(a) is calibrated to the seeds' starting point, about 28 % utilization: the mean quiet time
between a team's training bursts is bisected, keeping the probe where (a) came nearest 28 % of
capacity on this seed's world (the demand is chosen by looking at (a) only); (b) and (c) then
replay the very same demand.
Park and restore times are those measured on an H200 (benchmarks/cluster/moves.py: PARK, RESTORE).
Then (a), (k), (b) and (c) over a sweep: 5 demands around each seed's calibration x the seeds
(benchmarks/cluster/sweep.py); the headline is each world's minimum and range.
The last line: `cluster sweep: ... target (c) >= 70 % at every point: met|missed; moves: gang p99
wait (c) -> (d) min, lost kernels N, openb default X %` (X: the FGD protocol on openb `default` with
moves, seed 42, benchmarks/placement/moves.py).
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import replace
from pathlib import Path

from benchmarks.cluster.moves import PARK as PARK_TIME
from benchmarks.cluster.moves import RESTORE
from benchmarks.cluster.notebooks import replay_alone
from benchmarks.cluster.plot import svg_lines
from benchmarks.cluster.replay import Metrics, Mode, replay
from benchmarks.cluster.sweep import measure as sweep
from benchmarks.cluster.sweep import points_table, verdict
from benchmarks.cluster.sweep import table as sweep_table
from benchmarks.cluster.world import SESSIONS_PER_TEAM, World, build
from benchmarks.culling.sessions import make_sessions
from gpupool.idle_culler.policy import Limits
from gpupool.pool.actions.move import MoveRules
from gpupool.pool.training import Project

TARGET_STATIC = 0.28
RESEARCHERS = 16
PARK = Limits(park_after_s=600, max_age_s=10**9, gpu_idle_hard_s=0)
MODES = {
    "static": Mode("(a) static: whole GPUs, a partition per team", None, fractions=False),
    # what a z2jh admin would run instead of gpupool: KAI-Scheduler's pooling (a queue per team whose
    # deserved quota is its partition, idle GPUs lent over quota and reclaimed), the same half-GPU
    # fractions, and z2jh's idle-culler as shipped (cull.timeout 3600 s without Jupyter activity,
    # cull.every 600 s, no maxAge; no GPU signal, no parking) modelled as benchmarks.culling's stock
    # row: a cell that runs silently past the timeout is stopped with its server
    "kai": Mode(
        "(k) z2jh + KAI-Scheduler: fractions, queue quotas with reclaim, z2jh's idle-culler",
        Limits(idle_limit_s=3600, jupyter_idle_s=0, max_age_s=0),
        fractions=True,
        cull_every_s=600,
        gpu_aware=False,
        notebooks_within_quota=True,
        guarantee_share=1.0,
    ),
    # the culler's rules as published with these figures (30/15 min, 4 h hard, 12 h max; the
    # defaults before #26, which the culling benchmark replaced: docs/culling.md#defaults)
    "pooled": Mode(
        "(b) gpupool: fractions + culling + guaranteed quotas",
        Limits(idle_limit_s=1800, jupyter_idle_s=900, gpu_idle_hard_s=4 * 3600, max_age_s=12 * 3600),
        fractions=True,
    ),
    "parking": Mode("(c) gpupool + parking", PARK, fractions=True, delays=RESTORE),
    "moves": Mode(
        "(d) gpupool + parking + moves",
        PARK,
        fractions=True,
        delays=RESTORE,
        moves=MoveRules(rest_s=600, per_hour=2, max_moves=4),
    ),
}


DENSE_SESSIONS, DENSE_MILLI = 20, 250  # the notebook-dense variant: 4x the sessions, each a quarter GPU
DENSE = {
    "parking-dense": replace(
        MODES["parking"],
        name=f"(c') (c), {DENSE_SESSIONS} quarter-GPU notebooks per team",
        notebook_milli=DENSE_MILLI,
    ),
    "moves-dense": replace(
        MODES["moves"],
        name=f"(d') (d), {DENSE_SESSIONS} quarter-GPU notebooks per team",
        notebook_milli=DENSE_MILLI,
    ),
}


def run(w: World, key: str) -> Metrics:
    mode = MODES[key] if key in MODES else DENSE[key]
    if key == "static":
        out = Metrics()
        for t in w.teams:
            g = w.gpus_per_team * 1000
            out.merge(
                replay(
                    w.inventory(t),
                    [n for n in w.notebooks if n.team == t],
                    [s for s in w.streams if s.project == t],
                    {t: Project(t, g, limit_milli=g)},
                    w.horizon,
                    mode,
                )
            )
        return out
    projects = {t: Project(t, int(w.gpus_per_team * 1000 * mode.guarantee_share)) for t in w.teams}
    return replay(w.inventory(), w.notebooks, w.streams, projects, w.horizon, mode)


def calibrate(seed: int, steps: int = 7) -> float:
    """The mean quiet time (h) between training bursts that puts (a) nearest 28 % utilization:
    bisection (less quiet, more use), keeping the probe that came nearest — utilization is not
    smooth in the quiet time (a burst more or less in the week moves it by points)."""
    lo, hi = 20.0, 160.0
    best = (1.0, lo)
    for _ in range(steps):
        mid = round((lo * hi) ** 0.5, 1)  # bisect on a log scale; printed and reusable with --quiet-h
        util = run(build(seed, mid, RESEARCHERS), "static").utilization
        print(f"  calibration: quiet {mid:.1f} h -> (a) {100 * util:.1f} %", file=sys.stderr, flush=True)
        best = min(best, (abs(util - TARGET_STATIC), mid))
        if util > TARGET_STATIC:
            lo = mid
        else:
            hi = mid
    return best[1]


def pct(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


def minutes(values: list[float], q: float) -> str:
    return f"{pct(values, q) / 60:.0f} min"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m benchmarks.cluster",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument(
        "--sessions", type=int, default=2000, help="notebook sessions for the notebooks-alone part"
    )
    ap.add_argument("--quiet-h", type=float, default=0.0, help="skip the calibration and use this quiet time")
    ap.add_argument(
        "--seeds", default="1,2,3", help="seeds of the demand sweep, comma-separated (empty: no sweep)"
    )
    ap.add_argument("--plot", default="", help="write an SVG of utilization over the week here")
    args = ap.parse_args(argv)
    t0 = time.perf_counter()
    delays = RESTORE
    print(
        f"Park and restore times measured on an NVIDIA H200 (benchmarks/gpu_move_cycle.py): park {PARK_TIME.fixed_s} s"
        f" + {PARK_TIME.per_gib_s} s per GiB, restore {RESTORE.fixed_s} s + {RESTORE.per_gib_s} s per GiB per"
        " process; a kernel holding half its share's memory, the resume hook polling every second.\n"
    )

    # --- the notebook sessions alone ------------------------------------------------
    sessions = make_sessions(args.sessions, args.seed)
    life = sum(s.lifetime_s * s.gpus for s in sessions)
    busy = sum(s.busy_s * s.gpus for s in sessions)
    print(f"Notebook sessions alone ({len(sessions)} Adobe sessions, seed {args.seed}):\n")
    print("| policy | used / reserved | parks | culls | lost kernel states | resume wait p50 | p95 | p99 |")
    print("|---|---|---|---|---|---|---|---|")
    print(f"| reserve for life | {100 * busy / life:.1f} % | 0 | 0 | 0 | | | |", flush=True)
    for label, limits in (
        (
            "gpupool culling: GPU idle 15 min + Jupyter quiet 10 min, no time limits",
            Limits(idle_limit_s=900, jupyter_idle_s=600, gpu_idle_hard_s=0, max_age_s=10**9),
        ),
        ("gpupool parking: park after 10 min GPU idle, no time limits", PARK),
        (
            "gpupool parking: park after 5 min GPU idle, no time limits",
            Limits(park_after_s=300, max_age_s=10**9, gpu_idle_hard_s=0),
        ),
    ):
        print(f"  replaying: {label}", file=sys.stderr, flush=True)
        a = replay_alone(sessions, limits, delays, args.seed)
        waits = a.resume_waits
        tail = (
            f"{pct(waits, 0.5):.1f} s | {pct(waits, 0.95):.1f} s | {pct(waits, 0.99):.1f} s"
            if waits
            else " | | "
        )
        print(
            f"| {label} | {a.used_pct:.1f} % | {a.parks} | {a.culls} | {a.lost_states} | {tail} |", flush=True
        )

    # --- the shared cluster -----------------------------------------------------------
    calibrated: dict[int, float] = {}

    def quiet_of(seed: int) -> float:
        if seed not in calibrated:
            calibrated[seed] = calibrate(seed)
        return calibrated[seed]

    quiet = args.quiet_h or quiet_of(args.seed)
    w = build(args.seed, quiet, RESEARCHERS)
    print(
        f"\nShared cluster: {len(w.teams)} teams x {w.gpus_per_team} GPUs = {w.capacity_gpus} GPUs, one week;"
        f" {len(w.notebooks)} notebook sessions; training bursts of mean 8 h every {quiet:.1f} h of quiet"
        f" (calibrated), {RESEARCHERS} researchers per team while busy; seed {args.seed}\n"
    )
    results = {}
    for key in MODES:
        print(f"  replaying {MODES[key].name}", file=sys.stderr, flush=True)
        results[key] = run(w, key)
    base = results["static"]
    print(
        "| world | GPU utilization of capacity | allocation | experiments completed | per 1,000 GPU-h |"
        " vs (a) | notebook waits for a GPU p50 / p99 | notebooks used / reserved | lost kernel states |"
        " resume waits p50 / p95 / p99 (resumes) |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for key, m in results.items():
        resume = (
            (
                f"{pct(m.resume_waits, 0.5):.1f} s / {pct(m.resume_waits, 0.95):.1f} s /"
                f" {pct(m.resume_waits, 0.99):.0f} s ({len(m.resume_waits)})"
            )
            if m.resume_waits
            else "—"
        )
        print(
            f"| {MODES[key].name} | {100 * m.utilization:.1f} % | {100 * m.allocation:.1f} % | {m.experiments} |"
            f" {1000 * m.experiments_per_gpu_hour:.1f} | {m.experiments_per_gpu_hour / base.experiments_per_gpu_hour:.2f}x"
            f" | {minutes(m.waits, 0.5)} / {minutes(m.waits, 0.99)} ({len(m.waits)} spawns) |"
            f" {100 * m.nb_used_s / max(m.nb_reserved_s, 1):.1f} % | {m.lost_states} | {resume} |"
        )
    c = results["parking"]
    print(
        f"\n(c) vs targets: utilization {100 * c.utilization:.1f} % (target >= 70 %), experiments per GPU-hour"
        f" {c.experiments_per_gpu_hour / base.experiments_per_gpu_hour:.2f}x of (a) (target >= 2x), lost kernel"
        f" states {c.lost_states} (target 0); {c.parks} parks, {c.preemptions} train preemptions"
    )
    dense_world = build(args.seed, quiet, RESEARCHERS, sessions_per_team=DENSE_SESSIONS)
    dense = {}
    for key in DENSE:
        print(f"  replaying {DENSE[key].name}", file=sys.stderr, flush=True)
        dense[key] = run(dense_world, key)
    print(
        f"\n8-GPU gang jobs and moves; (c') and (d'): the same teams and training with {DENSE_SESSIONS} notebook"
        f" sessions a week per team instead of {SESSIONS_PER_TEAM}, each on a quarter GPU:\n"
    )
    print(gang_table({**results, **dense}, w.horizon))
    openb = openb_default_with_moves()
    d = results["moves"]
    print(
        f"\n(d) vs targets: gang p99 wait {pct(d.gang_waits, 0.99) / 60:.0f} min against (c)'s"
        f" {pct(c.gang_waits, 0.99) / 60:.0f} min (target <= half), lost kernels {d.moves.lost_kernels} (target 0),"
        f" utilization {100 * d.utilization:.1f} % against (c)'s {100 * c.utilization:.1f} % (target >=)"
    )
    if args.plot:
        series = {
            MODES[k].name: [100 * b / 3600 / w.capacity_gpus for b in m.hourly_busy][: int(w.horizon // 3600)]
            for k, m in results.items()
        }
        Path(args.plot).write_text(
            svg_lines(series, "GPU utilization of capacity over the replayed week (%)", "hour of the week")
        )
        print(f"plot: {args.plot}")
    seeds = tuple(int(x) for x in args.seeds.split(",") if x.strip())
    headline = ""
    if seeds:
        points = sweep(seeds, quiet_of, lambda seed, q: build(seed, q, RESEARCHERS), run)
        print(
            f"\nEvery world over {len(points) // len(seeds)} demands around each seed's calibration (quiet time"
            f" x 0.5 ... 2) and seeds {args.seeds}; min / median / max over the {len(points)} points:\n"
        )
        print(sweep_table(points, {k: MODES[k].name for k in MODES}))
        print()
        print(points_table(points))
        headline = verdict(points) + "; "
    print(f"wall time {time.perf_counter() - t0:.0f} s", file=sys.stderr)
    print(
        f"{headline}moves: gang p99 wait {pct(c.gang_waits, 0.99) / 60:.0f} -> {pct(d.gang_waits, 0.99) / 60:.0f} min,"
        f" lost kernels {d.moves.lost_kernels}, openb default {openb:.2f} %"
    )
    return 0


def gang_table(results: dict, horizon: float) -> str:
    """8-GPU jobs' waits, whole GPUs free, moves and what users' cells paid for them."""
    lines = [
        "| world | 8-GPU gang jobs | gang wait p50 / p99 | whole GPUs free (mean) | utilization |"
        " moves per hour | moves failed: kernel busy / restore failed | lost kernels |"
        " cells delayed by a move: count, p50 / p99 / max |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for key, m in results.items():
        if key == "static":
            continue
        hours = horizon / 3600
        mv = m.moves
        delays = (
            (
                f"{len(mv.cell_delays)}, {pct(mv.cell_delays, 0.5):.1f} / {pct(mv.cell_delays, 0.99):.1f} /"
                f" {max(mv.cell_delays, default=0):.1f} s"
            )
            if mv
            else "—"
        )
        lines.append(
            f"| {(MODES[key] if key in MODES else DENSE[key]).name} | {len(m.gang_waits)} | {minutes(m.gang_waits, 0.5)} /"
            f" {minutes(m.gang_waits, 0.99)} | {m.whole_free_s / m.horizon:.1f} |"
            f" {100 * m.utilization:.1f} % | {(mv.moves / hours) if mv else 0:.2f} |"
            f" {f'{mv.busy_at_switch} / {mv.restore_failed}' if mv else '—'} |"
            f" {mv.lost_kernels if mv else 0} | {delays} |"
        )
    return "\n".join(lines)


def openb_default_with_moves(seed: int = 42) -> float:
    """The FGD protocol on openb `default` with moves (benchmarks.placement --moves has all variants)."""
    from benchmarks.data import shared_data
    from benchmarks.placement.moves import CAP, idle_probability
    from benchmarks.placement.moves import run as run_moves
    from benchmarks.placement.robustness import _alloc_at
    from gpupool.pool.placement import DEFAULT_POLICY
    from gpupool.sim.traces import read_nodes, read_pods

    print("  openb default with moves", file=sys.stderr, flush=True)
    result = run_moves(
        read_nodes(shared_data("openb", "openb_node_list_gpu_node.csv")),
        read_pods(shared_data("openb", "openb_pod_list_default.csv")),
        DEFAULT_POLICY,
        seed,
        idle_probability(),
        CAP,
    )
    return _alloc_at(result, 130)


def reproducible() -> None:
    """A run's figures moved with Python's per-process string hash seed (something on the way
    iterates a set of strings: (b)'s utilization varied from 67.8 to 69.6 % between runs of the
    same seed): run again with a fixed one unless the caller chose one."""
    import os

    if os.environ.get("PYTHONHASHSEED") is None:
        os.environ["PYTHONHASHSEED"] = "0"
        os.execv(sys.executable, [sys.executable, "-m", "benchmarks.cluster", *sys.argv[1:]])


if __name__ == "__main__":
    reproducible()
    sys.exit(main())
