"""Replay one world's week through gpupool's own core: ClusterState and the placement policy
for every GPU share, the culler's policy (`decide`) for every notebook each minute, the
parking rule (`plan_claims`, `newcomer_view`) for resume claims, and the training scheduler
(`schedule`) for train jobs.

A minute-step replay. Notebooks come first (build before train): a spawn or resume claim
that does not fit makes training jobs that borrow beyond their guarantee give their GPUs
back (SIGTERM, GRACE, as the hub's training pool does). A culled user who returns starts a
new session at their next cell — with an empty kernel (a *lost kernel state*). A parked
notebook asks for its GPU back at its next cell and waits for a grant plus the restore.
"""

from __future__ import annotations

import heapq
import random
from dataclasses import dataclass, field

from benchmarks.cluster.moves import Mover, MoveStats
from benchmarks.cluster.world import GPU_MEMORY_MIB, MODEL, Notebook
from benchmarks.quota.workload import SimJob, Stream
from gpupool.gpu.parking import Delays
from gpupool.idle_culler.policy import IdleTracker, Limits, Workspace, decide
from gpupool.pool import ClusterState, Inventory, Request, get_policy
from gpupool.pool.actions.move import MoveRules
from gpupool.pool.parking import ParkedShare, newcomer_view, plan_claims
from gpupool.pool.training import Job, Project, in_quota_split, schedule

STEP = 60.0
GRACE = 60.0  # TrainPool.grace_s: SIGTERM to SIGKILL of a preempted train job
CHECKPOINT = 1800.0  # train jobs checkpoint every 30 min (benchmarks.quota)
POLL_S = 1.0  # the kernel's resume hook polls the hub every second
KERNEL_MEMORY_SHARE = 0.5  # assumption: a kernel holds half its share's GPU memory when parked
EPOCH = 1_780_272_000.0  # a Monday 00:00 UTC


@dataclass(frozen=True)
class Mode:
    name: str
    limits: Limits | None  # None: reserve for life (the static world)
    fractions: bool  # a 1-GPU notebook asks for half a GPU
    delays: Delays = Delays()
    moves: MoveRules | None = None  # world (d): idle notebooks moved for the head of the queue
    notebook_milli: int = 0  # every notebook asks for this share, whatever its session held (0: as held)
    # the culler decides every this many seconds (z2jh's jupyterhub-idle-culler: cull.every 600 s)
    cull_every_s: float = STEP
    # the culler sees GPU use (gpupool's); False: Jupyter activity alone, as the stock idle-culler
    # does, so a silent cell running past the timeout is stopped (benchmarks.culling's stock row)
    gpu_aware: bool = True
    # KAI-Scheduler's rule for non-preemptible workloads (workspaces at the build priority): a
    # team's notebooks together fit within its queue's deserved quota, or wait (NonPreemptibleOverQuota)
    notebooks_within_quota: bool = False
    guarantee_share: float = 0.5  # of each team's partition: its guaranteed (deserved) quota


@dataclass
class Metrics:
    capacity_gpus: int = 0
    horizon: float = 0.0
    busy_s: float = 0.0  # GPU-seconds busy: notebook cells on their share, running train jobs
    alloc_s: float = 0.0
    nb_used_s: float = 0.0
    nb_reserved_s: float = 0.0
    experiments: int = 0
    waits: list[float] = field(default_factory=list)  # notebook spawns (incl. returns after a cull)
    resume_waits: list[float] = field(default_factory=list)
    lost_states: int = 0
    killed_cells: int = 0
    culls: int = 0
    parks: int = 0
    preemptions: int = 0
    hourly_busy: list[float] = field(default_factory=list)  # GPU-seconds busy per hour
    gang_waits: list[float] = field(default_factory=list)  # 8-GPU jobs: submit to first start (or the end)
    whole_free_s: float = 0.0  # GPU-seconds of GPUs wholly free
    hourly_whole_free: list[float] = field(default_factory=list)
    moves: MoveStats | None = None

    def merge(self, other: Metrics) -> None:
        self.capacity_gpus += other.capacity_gpus
        self.horizon = max(self.horizon, other.horizon)
        for name in (
            "busy_s",
            "alloc_s",
            "nb_used_s",
            "nb_reserved_s",
            "experiments",
            "lost_states",
            "killed_cells",
            "culls",
            "parks",
            "preemptions",
        ):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        self.waits += other.waits
        self.gang_waits += other.gang_waits
        self.whole_free_s += other.whole_free_s
        self.resume_waits += other.resume_waits
        n = max(len(self.hourly_busy), len(other.hourly_busy))
        self.hourly_busy = [
            (self.hourly_busy[i] if i < len(self.hourly_busy) else 0.0)
            + (other.hourly_busy[i] if i < len(other.hourly_busy) else 0.0)
            for i in range(n)
        ]

    @property
    def gpu_hours(self) -> float:
        return self.capacity_gpus * self.horizon / 3600

    @property
    def utilization(self) -> float:
        return self.busy_s / 3600 / self.gpu_hours

    @property
    def allocation(self) -> float:
        return self.alloc_s / 3600 / self.gpu_hours

    @property
    def experiments_per_gpu_hour(self) -> float:
        return self.experiments / self.gpu_hours


@dataclass
class NB:
    nb: Notebook
    milli: int
    cells: list[tuple[float, float]]  # absolute
    state: str = "future"  # future | want | held | parked | claim | culled | done
    since: float = 0.0  # want: asked at; claim: claimed at; held: this session's start
    first_try: float | None = None  # the step of the first attempt (waits count from there)
    placement: object = None
    tracker: IdleTracker | None = None
    last_activity: float = 0.0
    cell: int = 0  # index of the first cell not yet ended

    def busy(self, t: float) -> bool:
        while self.cell < len(self.cells) and self.cells[self.cell][1] <= t:
            self.cell += 1
        return self.cell < len(self.cells) and self.cells[self.cell][0] <= t

    def started_in(self, a: float, b: float) -> float | None:
        """Start of a cell in (a, b], if any (the user came back)."""
        for s, _ in self.cells[self.cell :]:
            if s > b:
                return None
            if s > a:
                return s
        return None

    def more_cells_after(self, t: float) -> bool:
        return any(s > t for s, _ in self.cells[self.cell :])


def restore_s(milli: int, delays: Delays) -> float:
    """The driver restores each GPU's memory (in parallel across GPUs) of one kernel."""
    per_gpu = min(milli, 1000)
    return delays.for_mib(int(GPU_MEMORY_MIB * per_gpu / 1000 * KERNEL_MEMORY_SHARE))


def replay(
    inventory: Inventory,
    notebooks: list[Notebook],
    streams: list[Stream],
    projects: dict[str, Project],
    horizon: float,
    mode: Mode,
    seed: int = 0,
) -> Metrics:
    state = ClusterState(inventory)
    policy = get_policy("best-fit")
    rng = random.Random(seed)
    jitter = random.Random(seed + 1)
    static = mode.limits is None
    m = Metrics(
        capacity_gpus=inventory.gpu_count,
        horizon=horizon,
        hourly_busy=[0.0] * int(horizon // 3600 + 1),
        hourly_whole_free=[0.0] * int(horizon // 3600 + 1),
    )
    mover = Mover(mode.moves, seed=seed) if mode.moves is not None else None
    if mover is not None:
        m.moves = mover.stats
    moved = False
    nbs = []
    for nb in notebooks:
        s = nb.session
        milli = mode.notebook_milli or (500 if mode.fractions and s.gpus == 1 else s.gpus * 1000)
        cells = [(nb.start + a, nb.start + b) for a, b in s.cells]
        nbs.append(NB(nb, milli, cells))
    # training: closed-loop researchers, the same experiments in every world
    arrivals: list[tuple[float, int, SimJob]] = []
    seq = 0

    def arrive(job: SimJob | None) -> None:
        nonlocal seq
        if job is not None and job.submitted < horizon:
            seq += 1
            heapq.heappush(arrivals, (job.submitted, seq, job))

    for st in streams:
        arrive(type(st)(st.id, st.project, st.periods, st.seed, st.runtimes).next_job(0.0))
    pending: dict[str, SimJob] = {}
    running: dict[str, SimJob] = {}
    stopping: list[tuple[float, str, SimJob]] = []

    def as_job(j: SimJob) -> Job:
        return Job(
            j.id,
            j.project,
            Request.for_gpus(j.gpus * 1000),
            j.submitted,
            started=j.started,
            placement=j.placement,
        )

    def preempt(j: SimJob, now: float) -> None:
        del running[j.id]
        ran = now - j.started
        j.done += (ran // CHECKPOINT) * CHECKPOINT
        j.started = None
        m.preemptions += 1
        heapq.heappush(stopping, (now + GRACE, j.id, j))

    def make_room(req: Request, now: float) -> None:
        """Over-quota train jobs give their GPUs back, youngest first, until `req` would fit."""
        trial = state.copy()
        for _, _, j in stopping:
            trial.release(j.placement)
        if policy.choose(trial, req, rng) is not None:
            return  # GPUs already on their way back
        _, over = in_quota_split(projects, [as_job(j) for j in running.values()])
        chosen = []
        for j in sorted((running[i] for i in over), key=lambda j: -j.started):
            trial.release(j.placement)
            chosen.append(j)
            if policy.choose(trial, req, rng) is not None:
                for victim in chosen:
                    preempt(victim, now)
                return

    def parked_shares() -> list[ParkedShare]:
        return [
            ParkedShare(
                n.nb.id,
                "",
                "",
                tuple(range(max(1, n.milli // 1000))),
                min(n.milli, 1000),
                MODEL,
                claimed_at=n.since if n.state == "claim" else None,
            )
            for n in nbs
            if n.state in ("parked", "claim")
        ]

    def within_quota(n: NB) -> bool:
        team = n.nb.team
        held = sum(x.milli for x in nbs if x.state == "held" and x.nb.team == team)
        return held + n.milli <= projects[team].guarantee_milli

    t = 0.0
    while t < horizon:
        # a training pass when something changed, and every 5 min (the hub's: every 2 s)
        dirty = t % 300 == 0 or moved  # room a move freed goes to its head at once
        moved = False
        # --- training: finished runs and ended grace periods --------------------
        while arrivals and arrivals[0][0] <= t:
            j = heapq.heappop(arrivals)[2]
            pending[j.id] = j
            dirty = True
        for j in list(running.values()):
            if j.done + (t - j.started) >= j.work:
                j.finished = j.started + (j.work - j.done)
                state.release(j.placement)
                del running[j.id]
                m.experiments += 1
                dirty = True
                arrive(j.stream.next_job(j.finished) if j.stream else None)
        while arrivals and arrivals[0][0] <= t:
            j = heapq.heappop(arrivals)[2]
            pending[j.id] = j
        while stopping and stopping[0][0] <= t:
            _, _, j = heapq.heappop(stopping)
            state.release(j.placement)
            j.placement = None
            pending[j.id] = j
            dirty = True
        # --- notebooks: arrivals, ends, returning users ---------------------------
        for n in nbs:
            end = n.nb.start + n.nb.session.lifetime_s
            if n.state == "done":
                continue
            if t >= end:
                if n.state == "held":
                    state.release(n.placement)
                    dirty = True
                n.state = "done"
                continue
            if n.state == "future" and n.nb.start <= t:
                n.state, n.since, n.first_try = "want", n.nb.start, None
            elif n.state in ("parked", "culled"):
                back = n.started_in(t - STEP, t)
                if back is not None:
                    n.state, n.since, n.first_try = ("claim" if n.state == "parked" else "want"), back, None
        # --- build first: resume claims in order, then spawns ---------------------
        if any(n.state == "claim" for n in nbs):
            shares = parked_shares()
            plan = plan_claims(state, shares, policy, rng)
            by_id = {n.nb.id: n for n in nbs}
            for claim, spot in plan.granted:
                n = by_id[claim.owner]
                state.apply(spot)
                # the hub answers a claim at once, not at the next minute: the wait counts from
                # the first attempt, so the replay's step adds nothing to it
                waited = 0.0 if n.first_try is None else t - n.first_try
                m.resume_waits.append(waited + restore_s(n.milli, mode.delays) + jitter.uniform(0, POLL_S))
                n.state, n.placement = "held", spot
                n.tracker = IdleTracker(mode.limits.window_s, mode.limits.util_threshold_pct)
                n.last_activity = t
                if mover is not None:
                    mover.started(n.nb.id, t)
            for claim in plan.waiting:
                n = by_id[claim.owner]
                n.first_try = t if n.first_try is None else n.first_try
                make_room(claim.request(), t)
        view = (
            newcomer_view(state, parked_shares(), policy, rng)
            if any(n.state == "claim" for n in nbs)
            else state
        )
        for n in sorted((n for n in nbs if n.state == "want"), key=lambda n: n.since):
            req = Request.for_gpus(n.milli)
            if mode.notebooks_within_quota and not within_quota(n):
                n.first_try = t if n.first_try is None else n.first_try
                continue
            spot = policy.choose(view, req, rng)
            if spot is None:
                n.first_try = t if n.first_try is None else n.first_try
                if not static:
                    make_room(req, t)
                continue
            state.apply(spot)
            if view is not state:
                view.apply(spot)
            m.waits.append(0.0 if n.first_try is None else t - n.first_try)
            n.state, n.placement = "held", spot
            n.since = t
            n.last_activity = t
            n.tracker = None if static else IdleTracker(mode.limits.window_s, mode.limits.util_threshold_pct)
            if mover is not None:
                mover.started(n.nb.id, t)
        # --- the culler's pass --------------------------------------------------------
        for n in nbs:
            if n.state != "held":
                continue
            busy = n.busy(t)
            if static:
                continue
            if n.nb.session.user_present(t - n.nb.start):
                n.last_activity = t
            n.tracker.add(t, 100.0 if busy else 0.0)
            if t % mode.cull_every_s:
                continue
            gpu_idle = n.tracker.idle_s if mode.gpu_aware else None
            ws = Workspace(n.nb.id, "", EPOCH + n.since, EPOCH + n.last_activity, gpu_idle)
            d = decide(ws, EPOCH + t, mode.limits)
            if d.action == "park":
                state.release(n.placement)
                n.state, n.placement = "parked", None
                m.parks += 1
                dirty = True
            elif d.action == "cull":
                state.release(n.placement)
                n.placement = None
                m.culls += 1
                dirty = True
                m.killed_cells += busy
                if n.more_cells_after(t):
                    m.lost_states += 1  # the user comes back to an empty kernel
                    n.state = "culled"
                else:
                    n.state = "done"
        # --- training pass ----------------------------------------------------------
        if not dirty or not pending:
            plan = None
        else:
            tview = newcomer_view(state, parked_shares(), policy, rng)
            plan = schedule(
                tview,
                projects,
                [as_job(j) for j in pending.values()],
                [as_job(j) for j in running.values()],
                t,
                policy,
                rng,
                stopping=[as_job(j) for _, _, j in stopping],
            )
        for p in plan.preempt if plan else ():
            if p.job in running:
                preempt(running[p.job], t)
        for a in plan.admit if plan else ():
            if a.job not in pending:
                continue
            try:
                state.apply(a.placement)
            except Exception:  # noqa: BLE001 - planned on a view that kept room for claims
                continue
            j = pending.pop(a.job)
            j.placement, j.started = a.placement, t
            running[j.id] = j
            if j.first_start is None:
                j.first_start = t
                if j.gpus == 8:
                    m.gang_waits.append(t - j.submitted)
        if mover is not None and pending:
            before = mover.stats.moves
            mover.step(
                t, state, nbs, pending, running, stopping, projects, as_job, parked_shares, policy, rng
            )
            moved = mover.stats.moves > before
        # --- accounting for this minute -----------------------------------------------
        busy_s = 0.0
        for j in running.values():
            busy_s += j.gpus * STEP
        alloc_s = busy_s + sum(j.gpus * STEP for _, _, j in stopping)
        for n in nbs:
            if n.state == "held":
                share = n.milli / 1000 * STEP
                alloc_s += share
                m.nb_reserved_s += share
                if n.busy(t):
                    busy_s += share
                    m.nb_used_s += share
        m.busy_s += busy_s
        m.alloc_s += alloc_s
        m.hourly_busy[int(t // 3600)] += busy_s
        whole = float((state.gpu_free == 1000).sum()) * STEP
        m.whole_free_s += whole
        m.hourly_whole_free[int(t // 3600)] += whole
        t += STEP
    # 8-GPU jobs still waiting at the end waited at least this long: counted, not hidden
    m.gang_waits += [horizon - j.submitted for j in pending.values() if j.gpus == 8 and j.first_start is None]
    return m
