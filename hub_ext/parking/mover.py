"""Moving idle notebooks in the hub process, so that the head of the queue can start.

Every `GPUMover.interval_s` the mover looks at the head of the queue: a parked notebook's resume
claim that fits nowhere, else the first queued training job (within its project's guarantee
first, then borrowers) if it does not fit. For it, the
pure move action (gpupool.pool.actions.move) plans the fewest moves of notebooks whose GPU the
idle culler's samplers found idle (its last report, `api/culler/report`). Each move, one at a
time, make-before-break:

1. the intent and the destination's reservation (an allocation of kind "move") are written in
   one transaction — the destination is held before anything else happens;
2. the kernels are parked on the source and restored onto the destination, their GPU UUID
   remapped (gpupool.gpu.moving; the phase is written as it passes);
3. the workspace's allocation is switched to the destination and the source released, in one
   transaction. When the restore fails the kernels go back to the source (still held) and the
   destination is released; when that fails too the kernel is reported lost with the reason.

A hub that dies anywhere in between finishes the move at start-up from the phase written
(`recover`). The user reads the outcome in `%gpupool` and the JupyterLab status bar: "moved to
GPU 3 at 14:02 (to make room for a training job)". Off by default: `c.GPUMover.enabled = True`.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
import time
from collections.abc import Awaitable, Callable, Coroutine, Mapping
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Any

from sqlalchemy import select
from traitlets import Bool, Float, Int
from traitlets.config import Config, Configurable

from gpupool.alloc.manager import PoolManager, Workload
from gpupool.gpu.moving import Outcome, move_processes, recover
from gpupool.hub import failpoints
from gpupool.pool import PoolError, Request, format_gpus
from gpupool.pool.actions.move import HOUR, Movable, MovePlan, MoveRules, Step, plan_moves
from gpupool.pool.parking import plan_claims
from gpupool.pool.request import Placement
from gpupool.store import Allocation, Event, Move
from gpupool.vocab.culling import CullerState
from gpupool.vocab.kinds import ACTIVE_PHASES, AllocationState, MovePhase, WorkloadKind
from gpupool.vocab.states import HAS_RUN, JobState

if TYPE_CHECKING:
    from gpupool.parking.service import ParkingService
    from gpupool.store.jobs import TrainJob
    from gpupool.train.service import TrainingService

log = logging.getLogger("gpupool.parking.mover")
KEEP_S = 24 * HOUR  # ended moves are kept this long: the status line and the hourly limit read them
STALE_REPORT_S = 600.0  # a culler report older than this says nothing about what is idle now


class GPUMover(Configurable):
    """Moving idle notebooks to make room for the head of the queue (off by default)."""

    enabled = Bool(
        False,
        config=True,
        help="""Move idle notebooks between GPUs when that lets the
        head of the queue start: a queued training job (those within their project's guarantee
        first), or a parked notebook waiting for its GPU back. A move parks the kernels' GPU
        memory and restores it on another GPU of the same model (nothing restarts; the next cell
        waits a few seconds at most), destination reserved before the source is released. Needs
        GPU parking (CUDA driver r570+, or virtual GPUs) and the idle culler, whose samplers say
        which GPUs are idle. Example::

            c.GPUMover.enabled = True
        """,
    )
    interval_s = Float(
        10.0,
        config=True,
        help="""Seconds between looks at the queue. Example::

            c.GPUMover.interval_s = 30
        """,
    )
    idle_after_s = Float(
        120.0,
        config=True,
        help="""A notebook may be moved once the idle culler's
        samplers have found its GPU idle this long. Example::

            c.GPUMover.idle_after_s = 300
        """,
    )
    head_wait_s = Float(
        30.0,
        config=True,
        help="""How long the head of the queue waits before
        notebooks move for it (ending jobs and reclaims come first). Example::

            c.GPUMover.head_wait_s = 120
        """,
    )
    rest_s = Float(
        600.0,
        config=True,
        help="""No notebook is moved within this long of its start,
        its last park or resume, or its last move. Example::

            c.GPUMover.rest_s = 1800
        """,
    )
    per_hour = Int(
        2,
        config=True,
        help="""At most this many moves of one notebook in any hour.
        Example::

            c.GPUMover.per_hour = 1
        """,
    )
    max_moves = Int(
        4,
        config=True,
        help="""At most this many notebooks move for one waiting job
        or claim. Example::

            c.GPUMover.max_moves = 8
        """,
    )
    spawn_wait_s = Float(
        120.0,
        config=True,
        help="""How long a new workspace that fits nowhere may
        wait while idle notebooks move to make room for it (the spawn page says so); the spawn is
        refused after that, or sooner when no move can make room (the spawner's start_timeout
        bounds the wait too). Example::

            c.GPUMover.spawn_wait_s = 60
        """,
    )
    lock_timeout_s = Float(
        2.0,
        config=True,
        help="""How long parking a kernel for a move may wait
        for its running GPU work; a kernel still busy then is not moved. Example::

            c.GPUMover.lock_timeout_s = 1
        """,
    )

    def rules(self) -> MoveRules:
        return MoveRules(rest_s=self.rest_s, per_hour=self.per_hour, max_moves=self.max_moves)


@dataclass(frozen=True)
class Head:
    request: Request
    why: str  # after "to make room for"
    view: Any  # the pool as the head may use it
    done: Callable[[Placement], None]  # told where the head fits once the moves are done
    no_plan: Callable[[], None] = lambda: None  # told when no moves can make room for it now
    moving: Callable[[int, int], None] = lambda step, steps: None  # told as each move begins


def _nothing(target: Placement) -> None:
    pass


@dataclass
class SpawnWait:
    """A spawn that fits nowhere but will once idle notebooks move (the spawner waits for it)."""

    request: Request
    groups: list[str]
    since: float
    until: float  # the mover gives up then (the spawner may give up sooner: its start timeout)
    message: str  # what the spawn page says
    failed: str = ""  # why no moves make room after all: the spawn's next try is refused


def _pin(training: TrainingService, job_id: str) -> Callable[[Placement], None]:
    """Where the job starts: its spot, pinned as a consolidation's (the next cycle admits it there)."""

    def pin(target: Placement) -> None:
        training.pins[job_id] = target

    return pin


class MoverService:
    def __init__(
        self,
        pool: PoolManager,
        parking: ParkingService,
        cfg: GPUMover,
        findings: Callable[[], CullerState],
        training: TrainingService | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        """`parking`: the hub's ParkingService (its backend, its process finder, its in-flight
        sets); `findings`: the culler's last report ({"workspaces": {"owner/name": ...}})."""
        self.pool, self.parking, self.cfg, self.findings, self.training = (
            pool,
            parking,
            cfg,
            findings,
            training,
        )
        self.clock = clock
        self.busy = False  # a plan is being carried out
        self._tasks: set[asyncio.Task[object]] = set()
        self.spawns: dict[tuple[str, str], SpawnWait] = {}  # spawns waiting for moves, by workspace
        self.loop: asyncio.AbstractEventLoop | None = None  # the hub's, once a pass ran there

    # --- what waits ----------------------------------------------------------------
    def head(self, now: float) -> Head | None:
        """A resume claim waiting for its GPU first (claims come before newcomers), else the
        first queued training job (within its guarantee first, then borrowers) if it does not
        fit; only once it waited `head_wait_s`."""
        claims = plan_claims(self.pool.state, self.pool.parked_without_gpu(), self.pool.policy, self.pool.rng)
        for claim in claims.waiting:
            if claim.claimed_at is not None and now - claim.claimed_at >= self.cfg.head_wait_s:
                return Head(claim.request(), "a notebook resuming its GPU", self.pool.state, _nothing)
        spawn = self._spawn_head(now)  # build first: before training jobs, at once (the user watches)
        if spawn is not None:
            return spawn
        training = self.training
        if training is None:  # no training pool, or one the cluster schedules (Kubernetes)
            return None
        rows = training.jobs()
        used: dict[str, int] = {}
        for r in rows:
            if r.state in HAS_RUN:
                used[r.project] = used.get(r.project, 0) + r.num_gpu * r.gpu_milli

        def borrows(r: TrainJob) -> bool:
            return (
                used.get(r.project, 0) + r.num_gpu * r.gpu_milli
                > training.projects[r.project].guarantee_milli
            )

        # the scheduler's order, roughly: jobs within their project's guarantee first, then borrowers
        queued = sorted(
            (r for r in rows if r.state == JobState.QUEUED and r.project in training.projects),
            key=lambda r: (borrows(r), -r.priority, r.submitted, r.id),
        )
        view = None
        for r in queued:
            if now - r.submitted < self.cfg.head_wait_s:
                continue
            view = view if view is not None else training.train_view()
            req = Request(r.num_gpu, r.gpu_milli)
            if self.pool.policy.choose(view, req, self.pool.rng) is not None:
                return None  # the head fits: the next training cycle starts it
            return Head(req, "a training job", view, _pin(training, r.id))
        return None

    # --- a spawn that does not fit ----------------------------------------------------
    def room_for_spawn(self, request: Request, now: float | None = None) -> int | None:
        """How many idle notebooks would move for a new workspace of `request` (None: no moves
        make room). Changes nothing: the spawn form asks it to offer such a size."""
        now = self.clock() if now is None else now
        plan = plan_moves(
            self.pool.newcomer_view(),
            request,
            self.movable(now),
            now,
            self.cfg.rules(),
            self.pool.policy,
            self.pool.rng,
        )
        return len(plan.steps) if plan is not None and plan.steps else None

    def make_room_for_spawn(
        self, w: Workload, request: Request, groups: list[str], pools: tuple[str, ...] = ()
    ) -> str | None:
        """A spawn that fits nowhere (and that no train job's reclaim makes room for): when moving
        idle notebooks would make room, take it as the head of the queue and say what the spawn
        page shows while it waits; None when no moves can (the spawn is refused as before)."""
        if pools:
            return None  # node pools keep a workspace on their GPUs: not planned across them yet
        now = self.clock()
        key = (w.owner, w.name)
        wait = self.spawns.get(key)
        if wait is not None and wait.request == request and not wait.failed and now < wait.until:
            return wait.message
        if wait is not None:  # gave up, or another size: the next start plans anew
            self.spawns.pop(key, None)
            if wait.request == request:
                log.warning(
                    "no room made for %s by moving notebooks: %s", w.label, wait.failed or "it took too long"
                )
                return None
        steps = self.room_for_spawn(request, now)
        if steps is None:
            return None
        size = format_gpus(request.total_milli)
        until = now + self.cfg.spawn_wait_s
        self.spawns[key] = SpawnWait(request, list(groups), now, until, _spawn_message(size, 0, steps))
        holds = getattr(self.training, "build_holds", None)
        if holds is not None:  # the room being made is not the training pool's to take
            holds[key] = (request, until)
        log.info("%s waits while %d idle notebook(s) move to make room for it", w.label, steps)
        if self.loop is not None and not self.busy:
            self.loop.call_soon_threadsafe(self.tick)
        return self.spawns[key].message

    def _spawn_head(self, now: float) -> Head | None:
        for key, wait in sorted(self.spawns.items(), key=lambda kv: kv[1].since):
            if wait.failed or now >= wait.until or key not in self.pool.spawns_waiting:
                continue
            view = self.pool.newcomer_view()
            if self.pool.policy.choose(view, wait.request, self.pool.rng) is not None:
                continue  # it fits now: the spawn's next try takes it
            size = format_gpus(wait.request.total_milli)

            def moving(step: int, steps: int, wait: SpawnWait = wait, size: str = size) -> None:
                wait.message = _spawn_message(size, step, steps)

            def no_plan(wait: SpawnWait = wait) -> None:
                wait.failed = "no idle notebook can move to make room now"

            return Head(wait.request, "a new workspace", view, self._start_spawn(key), no_plan, moving)
        return None

    def _start_spawn(self, key: tuple[str, str]) -> Callable[[Placement], None]:
        """Once the moves are done: the waiting spawn's share, where the plan made room (its
        next try finds it held), if the spawn still waits and its quota still allows it."""

        def done(target: Placement) -> None:
            wait = self.spawns.get(key)
            w = Workload(WorkloadKind.BUILD, *key)
            if wait is None or key not in self.pool.spawns_waiting or self.pool.allocation(w) is not None:
                return  # the spawn gave up (or was served): nothing is held for nobody
            held = [h for h in self.pool.holdings(w.owner) if h.server_name != w.name]  # parked ones too
            try:
                self.pool.quotas.check(wait.request.total_milli, wait.groups, held, self.pool.group_usage())
                self.pool.reserve_at(w, target, wait.groups)
            except PoolError as err:  # its quota changed, or the room was taken meanwhile: its next try says
                log.warning("room made for %s not taken: %s", w.label, err)
                return
            self.pool.hooks.build_reserved(w)
            wait.message = "room made: starting the server"

        return done

    # --- who may move ----------------------------------------------------------------
    def movable(self, now: float) -> list[Movable]:
        report = self.findings()
        found = report["workspaces"]
        passed = report["pass_time"]
        if passed is not None and now - passed > STALE_REPORT_S:
            found = {}  # the culler stopped reporting: nothing is known to be idle
        since = now - HOUR
        with self.pool.store.session() as s:
            recent = list(s.scalars(select(Move).where(Move.started_at >= since)))
        moved: dict[str, list[float]] = {}
        rested: dict[str, float] = {}
        for m in recent:
            key = f"{m.owner}/{m.name}"
            moved.setdefault(key, []).append(m.started_at)
            rested[key] = max(rested.get(key, 0.0), m.ended_at or now)
        out = []
        for row in self.pool.store.allocations(kind=WorkloadKind.BUILD):
            key = f"{row.owner}/{row.name}"
            if row.state != JobState.RUNNING or not row.pid or (row.owner, row.name) in self._in_flight():
                continue
            f: Mapping[str, Any] = found.get(key) or {}
            idle = (
                bool(f.get("gpu_data"))
                and (f.get("gpu_idle_s") or 0) >= self.cfg.idle_after_s
                and f.get("gpu_idle_s") is not None
            )
            # its allocation was made at spawn or at its last resume: rest from then
            began = row.created.replace(tzinfo=dt.UTC).timestamp()
            out.append(
                Movable(
                    key,
                    Placement(row.node, tuple(row.gpus), row.gpu_milli, row.cpu_milli, row.memory_mib),
                    self.pool.inventory.node(row.node).model,
                    idle,
                    rested_since=max(began, rested.get(key, 0.0)),
                    moved_at=tuple(moved.get(key, ())),
                    memory_mib=int(f.get("memory_mib") or 0),
                )
            )
        return out

    def _in_flight(self) -> set[tuple[str, str]]:
        return set(self.parking._parking) | set(self.parking._restoring) | set(self.parking.moving)

    # --- a pass ---------------------------------------------------------------------
    def tick(self, now: float | None = None) -> MovePlan | None:
        """Plan for the head of the queue and start carrying the plan out (in the background on
        the hub's loop; at once without one). Returns the plan, None when nothing moves."""
        if self.busy:
            return None
        try:
            self.loop = asyncio.get_running_loop()
        except RuntimeError:
            pass
        now = self.clock() if now is None else now
        head = self.head(now)
        if head is None:
            return None
        plan = plan_moves(
            head.view, head.request, self.movable(now), now, self.cfg.rules(), self.pool.policy, self.pool.rng
        )
        if plan is None or not plan.steps:
            head.no_plan()
            return None
        log.info(
            "moving %d idle notebook(s) to make room for %s (%s)",
            len(plan.steps),
            head.why,
            format_gpus(head.request.total_milli),
        )
        self.busy = True
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            try:
                self._carry_out_now(plan, head)
            finally:
                self.busy = False
            return plan
        task = loop.create_task(self._carry_out(plan, head))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return plan

    def _carry_out_now(self, plan: MovePlan, head: Head) -> None:
        _at_once(self._moves(plan, head, _run))

    async def _carry_out(self, plan: MovePlan, head: Head) -> None:
        try:
            await self._moves(plan, head, _off_loop)
        except Exception:  # noqa: BLE001 - a failed plan must not stop the next pass
            log.exception("moving notebooks failed")
        finally:
            self.busy = False

    async def _moves(
        self, plan: MovePlan, head: Head, run: Callable[[Callable[[], Outcome]], Awaitable[Outcome]]
    ) -> None:
        """The plan's moves one at a time; `run` runs each move's driver work (parking the
        kernels and restoring them on the destination): at once, or off the hub's event loop."""
        for i, step in enumerate(plan.steps):
            head.moving(i + 1, len(plan.steps))
            begun = self._begin(step, head.why)
            if begun is None:
                return
            move_id, pids, gpu_map = begun
            work = partial(
                move_processes, self.parking.backend, pids, gpu_map, self._lock_ms(), self._on_phase(move_id)
            )
            try:
                out = await run(work)
            except Exception as err:  # noqa: BLE001 - finished from its phase, as after a crash
                log.exception("move of %s failed", step.id)
                out = self._finish(move_id, f"the move failed: {err}")
            if self._end(move_id, out) != MovePhase.MOVED:
                return
        head.done(plan.target)

    def _finish(self, move_id: int, why: str) -> Outcome:
        """Finish a move that stopped half-way (a crash, an unexpected error) from the phase it
        reached (gpupool.gpu.moving.recover): every process ends on one GPU."""
        with self.pool.store.session() as s:
            m = s.get_one(Move, move_id)
            pids, phase, server_pid = list(m.pids or []), m.phase, m.server_pid
            gpu_map = dict(zip(m.from_uuids, m.to_uuids, strict=True))
        try:
            if not pids and server_pid:
                pids = sorted(self.parking.pids_of(server_pid))
            out = recover(self.parking.backend, pids, phase, gpu_map, self._on_phase(move_id))
        except Exception as err:  # noqa: BLE001 - where its kernel is, nobody can say: reported lost
            return Outcome(MovePhase.LOST, f"{why}; finishing the move failed: {err}", tuple(pids))
        return Outcome(MovePhase.ABORTED, why) if out.result == MovePhase.ABORTED else out

    def _lock_ms(self) -> int:
        return int(self.cfg.lock_timeout_s * 1000)

    # --- one move ------------------------------------------------------------------------
    def _begin(self, step: Step, why: str) -> tuple[int, list[int], dict[str, str]] | None:
        """The intent and the destination's reservation, in one transaction; None when the
        workspace is no longer where the plan found it."""
        owner, name = step.id.split("/", 1)
        row = self.pool.allocation(Workload(WorkloadKind.BUILD, owner, name))
        if row is None or row.node != step.source.node or tuple(row.gpus) != step.source.gpus or not row.pid:
            return None
        src = self.pool.inventory.node(step.source.node)
        dst = self.pool.inventory.node(step.dest.node)
        from_uuids = [src.gpus[g].uuid for g in step.source.gpus]
        to_uuids = [dst.gpus[g].uuid for g in step.dest.gpus]
        self.pool.state.apply(step.dest)
        try:
            with self.pool.store.session() as s:
                move = Move(
                    owner=owner,
                    name=name,
                    from_node=step.source.node,
                    from_gpus=list(step.source.gpus),
                    from_uuids=from_uuids,
                    to_node=step.dest.node,
                    to_gpus=list(step.dest.gpus),
                    to_uuids=to_uuids,
                    gpu_milli=step.dest.gpu_milli,
                    why=why,
                    phase=MovePhase.RESERVED,
                    server_pid=row.pid,
                    started_at=self.clock(),
                )
                s.add(move)
                s.add(
                    Allocation(
                        kind=WorkloadKind.MOVE,
                        owner=owner,
                        name=name,
                        node=step.dest.node,
                        gpus=list(step.dest.gpus),
                        gpu_milli=step.dest.gpu_milli,
                        cpu_milli=step.dest.cpu_milli,
                        memory_mib=step.dest.memory_mib,
                        groups=list(row.groups or []),
                        state=AllocationState.RESERVED,
                    )
                )
                s.flush()
                move_id = move.id
        except Exception:
            self.pool.state.release(step.dest)
            raise
        # processes started from now on use the destination, held already (make-before-break)
        self.pool.placement_changed(Workload(WorkloadKind.BUILD, owner, name))
        self.parking.moving[(owner, name)] = (
            f"moving to GPU {_gpus(step.dest.gpus)}{_on(dst.name, src.name)}"
            f" (to make room for {why}): a cell waits a few seconds"
        )
        failpoints.reach("move.reserved")
        pids = sorted(self.parking.pids_of(row.pid))
        return move_id, pids, dict(zip(from_uuids, to_uuids, strict=True))

    def _on_phase(self, move_id: int) -> Callable[[MovePhase, list[int]], None]:
        def phase(name: MovePhase, pids: list[int]) -> None:
            with self.pool.store.session() as s:
                m = s.get_one(Move, move_id)
                m.phase, m.pids = name, list(pids)
            failpoints.reach(f"move.{name}")

        return phase

    def _end(self, move_id: int, out: Outcome) -> MovePhase:
        """Switch the workspace to the destination (moved), or release the destination (any
        other end); the event says what happened and why."""
        now = self.clock()
        with self.pool.store.session() as s:
            m = s.get_one(Move, move_id)
            owner, name = m.owner, m.name
            dest = s.scalar(select(Allocation).filter_by(kind=WorkloadKind.MOVE, owner=owner, name=name))
            build = s.scalar(select(Allocation).filter_by(kind=WorkloadKind.BUILD, owner=owner, name=name))
            source = _placement(build) if build is not None else None
            result = out.result
            if build is None:  # stopped meanwhile: whatever the kernel's fate, nothing is lost to anyone
                result, reason = MovePhase.ABORTED, "the workspace stopped during the move"
            else:
                reason = out.reason
            m.phase, m.ended_at, m.reason = result, now, reason[:2000]
            moved = result == MovePhase.MOVED
            if moved and build is not None:  # moved: the workspace was there (above)
                build.node, build.gpus = m.to_node, list(m.to_gpus)
            released = _placement(dest) if dest is not None else None
            if dest is not None:
                s.delete(dest)
            what = f"build {owner}/{name or 'default'}"
            where = f"GPU {_gpus(m.to_gpus)}{_on(m.to_node, m.from_node)}"
            message = {
                MovePhase.MOVED: f"{what} moved from GPU {_gpus(m.from_gpus)} to {where} to make room for {m.why}",
                MovePhase.RETURNED: f"{what} stays on GPU {_gpus(m.from_gpus)}: {reason}",
                MovePhase.ABORTED: f"{what} was not moved: {reason}",
                MovePhase.LOST: f"{what}: its kernel was lost while moving to {where}: {reason}",
            }[result]
            s.add(
                Event(
                    kind=result.event,
                    owner=owner,
                    name=name,
                    message=message[:2000],
                    data={
                        "from_gpus": list(m.from_gpus),
                        "to_gpus": list(m.to_gpus),
                        "to_node": m.to_node,
                        "why": m.why,
                    },
                )
            )
        # the in-memory pool follows the committed rows: a moved workspace frees its source,
        # any other end frees the destination
        if moved and source is not None:
            self.pool.state.release(source)
        elif released is not None:
            self.pool.state.release(released)
        self.pool.placement_changed(
            Workload(WorkloadKind.BUILD, owner, name)
        )  # moved: the destination; else the source
        self.parking.moving.pop((owner, name), None)
        if result == MovePhase.LOST:
            self.parking.failures[(owner, name)] = f"the kernel was lost while moving: {reason}"
        (log.info if moved else log.warning)("%s", message)
        return result

    # --- after a restart -------------------------------------------------------------------
    def recover(self) -> list[str]:
        """Finish every move a crash interrupted (see gpupool.gpu.moving.recover); returns what happened."""
        with self.pool.store.session() as s:
            rows = list(s.scalars(select(Move).where(Move.phase.in_(ACTIVE_PHASES))))
            for m in s.scalars(select(Move).where(Move.ended_at < self.clock() - KEEP_S)):
                s.delete(m)
        done = []
        for m in rows:
            self.parking.moving[(m.owner, m.name)] = "finishing a move the hub's restart interrupted"
            out = self._finish(m.id, "the hub restarted before the kernel was parked")
            done.append(f"{m.owner}/{m.name}: {self._end(m.id, out)}")
        return done


async def _run(work: Callable[[], Outcome]) -> Outcome:
    return work()


async def _off_loop(work: Callable[[], Outcome]) -> Outcome:
    # the driver copies GBs: off the hub's event loop (the phases are written from there)
    return await asyncio.get_running_loop().run_in_executor(None, work)


def _at_once(moves: Coroutine[object, object, None]) -> None:
    """Carry out MoverService._moves without an event loop (a pass outside the hub's loop): with
    `_run` nothing in it waits, so it ends at its first step."""
    try:
        moves.send(None)
    except StopIteration:
        return
    moves.close()
    raise RuntimeError("moving notebooks waited without an event loop")


def _spawn_message(size: str, step: int, steps: int) -> str:
    what = f"{steps} idle notebook{'s' if steps > 1 else ''}"
    now = f" (moving {step} of {steps})" if step else ""
    return (
        f"Making room for {size}: {what} of other users {'move' if steps > 1 else 'moves'} to another"
        f" GPU{now} — nothing in {'them' if steps > 1 else 'it'} restarts; your server starts once"
        f" {'they are' if steps > 1 else 'it is'} done (seconds each)"
    )


def _placement(row: Allocation) -> Placement:
    return Placement(row.node, tuple(row.gpus), row.gpu_milli, row.cpu_milli, row.memory_mib)


def _gpus(gpus: list[int] | tuple[int, ...]) -> str:
    return ", ".join(str(g) for g in gpus)


def _on(node: str, other: str) -> str:
    return f" on {node}" if node != other else ""


def build_mover(
    config: Config,
    pool: PoolManager,
    parking: ParkingService | None,
    findings: Callable[[], CullerState],
    training: TrainingService | None = None,
) -> MoverService | None:
    cfg = GPUMover(config=config)
    if not cfg.enabled:
        return None
    if parking is None:
        log.warning("c.GPUMover.enabled is set but parking is off: notebooks are not moved")
        return None
    mover = MoverService(pool, parking, cfg, findings, training)
    for line in mover.recover():
        log.warning("move interrupted by the restart: %s", line)
    return mover
