"""The default policy against the better of FGD and BestFit on every workload mix.

Each workload (a resampled mix from `mixes.grid()`, or a shared openb variant) is run
through the FGD protocol at 130 % arrived with the default policy, `fgd` and `best-fit`
in the same run, for the same seeds. The anchor of a workload is the better of the two
others by mean allocation; the margin is the default's mean minus the anchor's, with the 95 %
interval of the per-seed difference (benchmarks/placement/paired.py) that calls it a win, a
tie or a loss. The worst margin is the smallest over all workloads.
"""

from __future__ import annotations

import os
import statistics
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass

from benchmarks.data import shared_data
from benchmarks.placement.mixes import Mix, grid, resample, shares_of
from benchmarks.placement.paired import LOSS, TIE, WIN, Interval, paired_interval
from gpupool.pool.inventory import Inventory
from gpupool.pool.placement import DEFAULT_POLICY
from gpupool.sim import fgd
from gpupool.sim.traces import TracePod, read_nodes, read_pods

VARIANTS = ["default", "gpushare40", "multigpu20", "cpu050", "gpuspec10"]
RIVALS = ["fgd", "best-fit"]
LEVEL = 130


@dataclass(frozen=True)
class Workload:
    label: str
    pods: list[TracePod]
    shares: dict[str, float]
    variant: bool  # a shared openb variant (published FGD figures exist)


def workloads(mixes: list[Mix] | None = None, variants: list[str] | None = None) -> list[Workload]:
    default = read_pods(shared_data("openb", "openb_pod_list_default.csv"))
    out = []
    for mix in grid() if mixes is None else mixes:
        pods = resample(default, mix)
        out.append(Workload(mix.label, pods, shares_of(pods), False))
    for name in VARIANTS if variants is None else variants:
        pods = default if name == "default" else read_pods(shared_data("openb", f"openb_pod_list_{name}.csv"))
        out.append(Workload(name, pods, shares_of(pods), True))
    return out


def _alloc_at(result: dict, level: int) -> float:
    levels = result["arrived_pct"]
    return (
        result["alloc_ratio_pct"][levels.index(level)] if level in levels else result["alloc_ratio_pct"][-1]
    )


_INVENTORY: Inventory | None = None


def _one(task: tuple[int, str, list[TracePod], str, int]) -> tuple[int, str, int, float, tuple[float, float]]:
    global _INVENTORY
    n, _, pods, policy, seed = task
    if _INVENTORY is None:
        _INVENTORY = read_nodes(shared_data("openb", "openb_node_list_gpu_node.csv"))
    result = fgd.run(_INVENTORY, pods, policy, seed)
    return n, policy, seed, _alloc_at(result, LEVEL), (result["wall_s"], result["cpu_s"])


@dataclass
class Row:
    workload: Workload
    seeds: dict[str, list[float]]  # policy -> allocation % at 130 % arrived, one per seed, in seed order
    walls: dict[str, list[tuple[float, float]]]  # policy -> (wall s, CPU s) per seed

    @property
    def alloc(self) -> dict[str, float]:
        """policy -> mean allocation % over the seeds"""
        return {p: statistics.fmean(v) for p, v in self.seeds.items()}

    @property
    def anchor(self) -> str:
        """The rival with the higher mean: the one the default must beat."""
        return max(RIVALS, key=lambda p: self.alloc[p])

    @property
    def margin(self) -> float:
        return self.alloc[DEFAULT_POLICY] - self.alloc[self.anchor]

    @property
    def interval(self) -> Interval:
        return paired_interval(self.seeds[DEFAULT_POLICY], self.seeds[self.anchor])


def run(loads: list[Workload], seeds: list[int], jobs: int = 1, progress=None) -> list[Row]:
    """Every workload x policy x seed, in `jobs` processes."""
    tasks = [
        (n, w.label, w.pods, p, s)
        for n, w in enumerate(loads)
        for p in [DEFAULT_POLICY, *RIVALS]
        for s in seeds
    ]
    allocs: dict[tuple[int, str, int], float] = {}
    walls: dict[tuple[int, str, int], tuple[float, float]] = {}
    with ProcessPoolExecutor(jobs) if jobs > 1 else _Serial() as pool:
        for done, (n, p, s, a, w) in enumerate(pool.map(_one, tasks, chunksize=1), 1):
            allocs[(n, p, s)], walls[(n, p, s)] = a, w
            if progress:
                progress(done, len(tasks))
    policies = [DEFAULT_POLICY, *RIVALS]
    return [
        Row(
            w,
            {p: [allocs[(n, p, s)] for s in seeds] for p in policies},  # keyed by seed: the pairs line up
            {p: [walls[(n, p, s)] for s in seeds] for p in policies},
        )
        for n, w in enumerate(loads)
    ]


class _Serial:
    """In-process stand-in for the pool with --jobs 1."""

    def __enter__(self) -> _Serial:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def map(self, fn, items, chunksize: int = 1):
        return map(fn, items)


def table(rows: list[Row], published: dict[str, float]) -> str:
    head = (
        "| workload | CPU-only % | sharing % | whole % | multi % | default (frag-aware) | fgd | best-fit"
        " | anchor | default − anchor, mean [95 % CI] | call | published FGD | default − published |"
    )
    lines = [head, "|" + "---|" * head.count(" | ") + "---|"]
    for r in rows:
        s = r.workload.shares
        pub = published.get(r.workload.label)
        extra = f"{pub:.2f} | {r.alloc[DEFAULT_POLICY] - pub:+.2f}" if pub is not None else " | "
        ci = r.interval
        lines.append(
            f"| {r.workload.label} | {s['cpu']:.0f} | {s['share']:.0f} | {s['whole']:.0f} | {s['multi']:.0f}"
            f" | {r.alloc[DEFAULT_POLICY]:.2f} | {r.alloc['fgd']:.2f} | {r.alloc['best-fit']:.2f}"
            f" | {r.anchor} | {ci} | {ci.call} | {extra} |"
        )
    return "\n".join(lines)


def calls(rows: list[Row]) -> dict[str, list[Row]]:
    """win / tie / loss -> the workloads called so."""
    out: dict[str, list[Row]] = {WIN: [], TIE: [], LOSS: []}
    for r in rows:
        out[r.interval.call].append(r)
    return out


def plot(rows: list[Row], path: str) -> bool:
    """A bar per workload: the margin over the better of fgd and best-fit. False without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    labels = [
        r.workload.label.replace("-", "\n") if not r.workload.variant else r.workload.label for r in rows
    ]
    cis = [r.interval for r in rows]
    fig, ax = plt.subplots(figsize=(max(8, 0.62 * len(rows)), 4.2))
    colors = [{WIN: "#2a7", TIE: "#999", LOSS: "#c33"}[c.call] for c in cis]
    ax.bar(
        range(len(rows)),
        [c.mean for c in cis],
        color=colors,
        yerr=[[c.mean - c.low for c in cis], [c.high - c.mean for c in cis]],
        capsize=2,
    )
    ax.axhline(0, color="black", linewidth=0.8)
    ax.set_xticks(range(len(rows)), labels, fontsize=6.5)
    ax.set_ylabel("default − max(fgd, best-fit)\n(points of GPU allocated at 130 % arrived)")
    ax.set_title(
        f"Margin of the default placement policy on every workload mix ({cis[0].n} seeds, 95 % CI; grey: tie)"
    )
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True
