"""One organisation's week: teams whose notebooks (Adobe's sessions, benchmarks.culling) and
training (Philly's run times, closed-loop researchers, benchmarks.quota) share one cluster.

* TEAMS teams, each with a partition of GPUS_PER_TEAM GPUs in the static world; in the
  pooled worlds half of it is the team's guaranteed training quota.
* notebooks: SESSIONS_PER_TEAM Adobe sessions a week per team (a day drawn per session, the
  session's own time of day), holding 1, 4 or 8 GPUs as in the cell file;
* training: a team is busy (exponential, mean BUSY_H) then quiet (mean `quiet_h`); while busy
  `researchers` researchers each submit an experiment, wait for its result, think 10 min and
  submit the next (benchmarks.quota.workload.Stream: the same experiments in every world).
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from benchmarks.culling.sessions import Session, make_sessions
from benchmarks.data import shared_data
from benchmarks.quota.workload import Bursts, Stream, _busy_periods
from gpupool.pool.inventory import GPU, Inventory, Node

DAY = 86400.0
WEEK = 7 * DAY
TEAMS = 16
GPUS_PER_TEAM = 8
SESSIONS_PER_TEAM = 5
BUSY_H = 8.0
MODEL = "V100"
GPU_MEMORY_MIB = 32768


@dataclass(frozen=True)
class Notebook:
    id: str
    team: str
    start: float  # absolute seconds into the week
    session: Session


@dataclass
class World:
    teams: list[str]
    notebooks: list[Notebook]
    streams: list[Stream]
    horizon: float
    quiet_h: float
    researchers: int
    gpus_per_team: int = GPUS_PER_TEAM
    nodes: dict[str, list[Node]] = field(default_factory=dict)  # a team's static partition

    def inventory(self, team: str | None = None) -> Inventory:
        nodes = self.nodes[team] if team else [n for t in self.teams for n in self.nodes[t]]
        return Inventory(nodes=tuple(nodes))

    @property
    def capacity_gpus(self) -> int:
        return sum(len(n.gpus) for t in self.teams for n in self.nodes[t])


def runtimes() -> list[float]:
    import csv

    with open(shared_data("philly", "philly_runtime.csv")) as f:
        return [min(86400.0, float(r["runtime"])) for r in csv.DictReader(f) if float(r["runtime"]) >= 60]


def build(
    seed: int,
    quiet_h: float,
    researchers: int,
    days: float = 7.0,
    teams: int = TEAMS,
    gpus_per_team: int = GPUS_PER_TEAM,
    sessions_per_team: int = SESSIONS_PER_TEAM,
) -> World:
    rng = random.Random(seed)
    bursts = random.Random(seed + 1)  # burst times do not depend on how many researchers there are
    names = [f"team{i}" for i in range(teams)]
    sessions = make_sessions(teams * sessions_per_team, seed)
    notebooks = []
    for k, s in enumerate(sessions):
        team = names[k % teams]
        day = rng.randrange(int(days))
        notebooks.append(Notebook(f"nb{k}", team, day * DAY + s.start_tod, s))
    horizon = days * DAY
    run = runtimes()
    streams = []
    nodes: dict[str, list[Node]] = {}
    for t in names:
        nodes[t] = [
            Node(
                f"{t}-n{i}", tuple(GPU(g, f"GPU-{t}-{i}-{g}", MODEL, GPU_MEMORY_MIB, True) for g in range(8))
            )
            for i in range(gpus_per_team // 8)
        ]
        periods = _busy_periods(bursts, horizon, Bursts(busy_h=BUSY_H, quiet_h=quiet_h))
        for r in range(researchers):
            streams.append(Stream(f"{t}-r{r}", t, periods, rng.randrange(2**31), run))
    return World(names, notebooks, streams, horizon, quiet_h, researchers, gpus_per_team, nodes)
