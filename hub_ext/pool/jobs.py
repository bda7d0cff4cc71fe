"""What train scheduling talks about: projects, departments, jobs, and the plan of one cycle.

Plain frozen records, shared by the scheduling actions (`gpupool.pool.actions`), the hub's
training service and the simulator.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from gpupool.pool.request import Placement, Request
from gpupool.vocab.states import PreemptCause


@dataclass(frozen=True)
class Project:
    name: str
    guarantee_milli: int
    weight: float = 1.0  # share of idle capacity lent beyond the guarantee
    limit_milli: int = -1  # -1: no limit
    priority: int = 0
    department: str = ""
    pools: tuple[str, ...] = ()  # node pools its jobs may use, in order of preference (empty: any)
    # a guarantee per node pool (pool, milli), in the order of `pools`; guarantee_milli is their sum
    pool_guarantees: tuple[tuple[str, int], ...] = ()
    parent: str = ""  # for one of a project's per-pool parts (pool/pool_quotas.py): the project

    def cap(self) -> float:
        return float("inf") if self.limit_milli < 0 else self.limit_milli


@dataclass(frozen=True)
class Department:
    """A level above projects (KAI's parent queue): its projects' guarantees add up to at most
    its guarantee, and together they never use more than its limit."""

    name: str
    guarantee_milli: int
    limit_milli: int = -1  # -1: no limit

    def cap(self) -> float:
        return float("inf") if self.limit_milli < 0 else self.limit_milli


@dataclass(frozen=True)
class Job:
    id: str
    project: str
    request: Request
    submitted: float
    priority: int = 0
    min_runtime_s: float = 0.0
    started: float | None = None  # when the current run started (running jobs)
    placement: Placement | None = None  # running jobs; for a pending job, its planned spot
    max_runtime_s: float = 0.0  # declared bound of a run (0: none); lets it backfill a reservation
    pools: tuple[str, ...] = ()  # node pools it may use, in order of preference (empty: its project's)
    # elastic (max_gpus > 0): it runs on min_gpus to max_gpus whole GPUs; `request` is its
    # current size when running, its minimum when pending
    min_gpus: int = 0
    max_gpus: int = 0

    @property
    def elastic(self) -> bool:
        return self.max_gpus > 0

    @property
    def placed(self) -> Placement:
        """Where a running (or stopping) job runs: it always has a placement."""
        if self.placement is None:
            raise ValueError(f"job {self.id} is not placed")
        return self.placement

    @property
    def milli(self) -> int:
        return self.request.total_milli


@dataclass(frozen=True)
class Admit:
    job: str
    placement: Placement


@dataclass(frozen=True)
class Preempt:
    job: str
    for_job: str
    reason: str  # in words, for the job's owner
    cause: PreemptCause = PreemptCause.GUARANTEE
    for_project: str = ""  # the project for_job belongs to


@dataclass(frozen=True)
class Move:
    """Consolidation: stop `job` (it resumes from its checkpoint) so that `for_job` fits on
    `node`; `to` is where the moved job fits again, checked before anything moves."""

    job: str
    to: Placement
    for_job: str
    target: Placement  # where for_job goes once the moved jobs have stopped


@dataclass(frozen=True)
class Resize:
    """An elastic job restarts from its checkpoint at another size: stop it, then start it at
    `to` (the caller pins it there)."""

    job: str
    to: Placement
    reason: str


@dataclass(frozen=True)
class Reserve:
    """`job` (a big gang job that waited too long) has `placement` reserved: the caller pins it
    there. `start_by` is when its GPUs should all be free (inf: not known)."""

    job: str
    placement: Placement
    start_by: float


@dataclass
class Plan:
    admit: list[Admit] = field(default_factory=list)
    preempt: list[Preempt] = field(default_factory=list)
    move: list[Move] = field(default_factory=list)
    reserve: list[Reserve] = field(default_factory=list)
    resize: list[Resize] = field(default_factory=list)


def in_quota_split(projects: dict[str, Project], running: Iterable[Job]) -> tuple[dict[str, int], set[str]]:
    """Usage per project, and which running jobs are over quota: within each project the
    highest-priority jobs fill the guarantee first, then the oldest, so the lowest-priority
    youngest are the ones borrowed (and reclaimed first)."""
    usage: dict[str, int] = {}
    over: set[str] = set()
    for job in sorted(running, key=lambda j: (-j.priority, j.started or 0, j.id)):
        used = usage.get(job.project, 0) + job.milli
        usage[job.project] = used
        if used > projects[job.project].guarantee_milli:
            over.add(job.id)
    return usage, over
