"""The contended multi-project workload of the quota benchmark (see benchmarks.quota).

Projects are Philly's virtual clusters (philly_vc.csv) scaled to 1/8: a project's guarantee is
its share of the GPUs. Every project alternates busy periods (exponential, mean 8 h) with quiet
ones (mean 16 h); while busy it wants about twice its guarantee (all three are `Bursts`). Jobs take 1, 2, 4 or 8 whole
GPUs (50/20/20/10 %) and run for a time drawn from Philly's run times (philly_runtime.csv,
capped at 24 h). Two arrival models with those same parameters:

* open: jobs arrive as a Poisson stream at the rate that keeps twice the guarantee busy;
  nothing depends on how fast the cluster serves them.
* closed: a busy project has as many researchers ("streams") as keep twice its guarantee busy;
  each submits an experiment, waits for its result, thinks (exponential, mean 10 min) and
  submits the next — how people iterate, and why faster service means more experiments.
"""

from __future__ import annotations

import csv
import random
import statistics
from dataclasses import dataclass, field

from benchmarks.data import shared_data
from gpupool.pool.inventory import GPU, Inventory, Node
from gpupool.pool.training import Project

THINK_MEAN_S = 600.0
SIZES, SIZE_WEIGHTS = (1, 2, 4, 8), (0.5, 0.2, 0.2, 0.1)
MEAN_GPUS = sum(s * w for s, w in zip(SIZES, SIZE_WEIGHTS, strict=True))


@dataclass
class SimJob:
    id: str
    project: str
    gpus: int
    work: float  # seconds of run time needed
    submitted: float
    stream: Stream | None = None  # closed loop: who submits the next experiment
    done: float = 0.0  # work saved in checkpoints
    started: float | None = None
    placement: object = None
    finished: float | None = None
    first_start: float | None = None
    needs_reclaim: bool = False
    in_quota_since: float | None = None  # pending and within its project's guarantee since


@dataclass
class Stream:
    """One researcher of a project: experiments one after another while the project is busy."""

    id: str
    project: str
    periods: list[tuple[float, float]]
    seed: int
    runtimes: list[float] = field(repr=False, default_factory=list)
    rng: random.Random = field(init=False, repr=False)
    count: int = 0

    def __post_init__(self) -> None:
        self.rng = random.Random(self.seed)  # the same experiments under every policy

    def next_job(self, after: float) -> SimJob | None:
        """The next experiment: `after` plus a think time, moved to the next busy period if
        that falls outside one; None when no busy period is left."""
        t = after + self.rng.expovariate(1 / THINK_MEAN_S) if self.count else after
        gpus = self.rng.choices(SIZES, SIZE_WEIGHTS)[0]
        work = self.rng.choice(self.runtimes)
        for start, end in self.periods:
            if t < end:
                self.count += 1
                return SimJob(f"{self.id}-{self.count}", self.project, gpus, work, max(t, start), stream=self)
        return None


@dataclass(frozen=True)
class Bursts:
    busy_h: float = 8.0  # mean busy period
    quiet_h: float = 16.0  # mean quiet period
    want: float = 2.0  # GPUs a busy project wants, in multiples of its guarantee


@dataclass
class Workload:
    inventory: Inventory
    projects: dict[str, Project]
    horizon: float
    jobs: list[SimJob] = field(default_factory=list)  # open loop
    streams: list[Stream] = field(default_factory=list)  # closed loop


def _busy_periods(rng: random.Random, horizon: float, b: Bursts) -> list[tuple[float, float]]:
    out, t = [], rng.expovariate(1 / (b.quiet_h * 3600))
    while t < horizon:
        end = min(horizon, t + rng.expovariate(1 / (b.busy_h * 3600)))
        out.append((t, end))
        t = end + rng.expovariate(1 / (b.quiet_h * 3600))
    return out


def load(days: float, seed: int, model: str = "open", bursts: Bursts = Bursts()) -> Workload:
    with open(shared_data("philly", "philly_vc.csv")) as f:
        vcs = [(r["vc"], int(r["node num"])) for r in csv.DictReader(f)]
    with open(shared_data("philly", "philly_runtime.csv")) as f:
        runtimes = [min(86400.0, float(r["runtime"])) for r in csv.DictReader(f) if float(r["runtime"]) >= 60]
    rng = random.Random(seed)
    nodes, projects = [], {}
    for vc, n in vcs:
        count = max(1, n // 8)
        for i in range(count):
            nodes.append(
                Node(f"{vc}-{i}", tuple(GPU(g, f"{vc}-{i}-{g}", "V100", 16000, True) for g in range(8)))
            )
        projects[vc] = Project(vc, guarantee_milli=count * 8 * 1000, weight=1.0)
    w = Workload(Inventory(nodes=tuple(nodes)), projects, days * 86400)
    mean_run = statistics.mean(runtimes)
    for vc, p in projects.items():
        periods = _busy_periods(rng, w.horizon, bursts)
        want_gpus = bursts.want * p.guarantee_milli / 1000
        if model == "closed":
            for k in range(max(1, round(want_gpus / MEAN_GPUS))):
                w.streams.append(Stream(f"{vc}-r{k}", vc, periods, rng.randrange(2**31), runtimes))
            continue
        rate = want_gpus / (MEAN_GPUS * mean_run)  # arrivals per second that keep 2G busy
        for start, end in periods:
            t = start
            while (t := t + rng.expovariate(rate)) < end:
                gpus = rng.choices(SIZES, SIZE_WEIGHTS)[0]
                w.jobs.append(SimJob(f"{vc}-{len(w.jobs)}", vc, gpus, rng.choice(runtimes), t))
    w.jobs.sort(key=lambda j: j.submitted)
    return w
