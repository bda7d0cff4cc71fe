"""World (d): world (c) with moves — idle notebooks moved, make-before-break, so that the head
of the queue can start (gpupool.pool.actions.move, as gpupool.parking.mover does in the hub).

Each minute, after the training pass, the head is the first waiting resume claim, else the first
pending training job (those within their project's guarantee first, then borrowers; in submit
order), if it does not fit. A
notebook may move when its GPU has been idle `idle_after_s` (the culler's tracker), it was not
started, resumed or moved within `rest_s`, and it moved fewer than `per_hour` times in the last
hour; at most `max_moves` move for one head. The head is pinned to the spot the plan freed (the
scheduler admits it there, as a consolidation's). A move takes the park and restore times of
`Delays` for the kernel's memory (half its share's, like the parking model); a cell the user
starts during that time waits for the rest of it — the extra delay users' cells saw.

A move fails the two ways the hub's mover does (gpupool/parking/mover.py):
* the kernel is busy at the switch: a cell the trace starts between the plan and the park is still
  running `lock_timeout_s` later (c.GPUMover.lock_timeout_s, 2 s), so the kernel is not moved and
  the plan stops there (moves already made stay made; the head waits for the next pass);
* the restore on the destination fails (RESTORE_FAILS of restores, an assumption: no failure was
  seen in the H200 runs, which are too few to bound the rate): the kernel is restored on its own GPU
  (tests/test_move_service.py), so it is not lost, its cells wait for park + restore + restore, and
  the plan stops there.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from benchmarks.cluster.world import GPU_MEMORY_MIB, MODEL
from gpupool.gpu.parking import Delays
from gpupool.pool import ClusterState, Request
from gpupool.pool.actions.move import HOUR, Movable, MoveRules, plan_moves
from gpupool.pool.parking import plan_claims

IDLE_AFTER_S = 120.0
LOCK_TIMEOUT_S = 2.0  # c.GPUMover.lock_timeout_s
RESTORE_FAILS = 0.05  # assumed share of restores that fail (see the docstring)


@dataclass
class MoveStats:
    moves: int = 0
    plans: int = 0
    cell_delays: list[float] = field(default_factory=list)  # per cell that started during a move
    lost_kernels: int = 0
    busy_at_switch: int = 0  # moves not made: the kernel was running a cell
    restore_failed: int = 0  # moves undone: the kernel went back to its own GPU


def kernel_mib(milli: int) -> int:
    """GPU memory a notebook's kernel holds, as the parking model assumes: half its share's."""
    return int(GPU_MEMORY_MIB * min(milli, 1000) / 1000 * 0.5)


# Measured on an NVIDIA H200 (driver CUDA 13, torch 2.11, benchmarks/gpu_move_cycle.py; docs/culling.md):
# a process holding 1 and 10 GiB, lock + checkpoint and restore + unlock, median of 3, fitted.
PARK = Delays(fixed_s=0.37, per_gib_s=0.58)
RESTORE = Delays(fixed_s=0.21, per_gib_s=0.19)


def move_s(milli: int, park: Delays = PARK, restore: Delays = RESTORE) -> float:
    """Park on the source plus restore on the destination of one kernel."""
    return park.for_mib(kernel_mib(milli)) + restore.for_mib(kernel_mib(milli))


class Mover:
    """The mover of world (d), called once per replayed minute."""

    def __init__(
        self,
        rules: MoveRules,
        park: Delays = PARK,
        restore: Delays = RESTORE,
        seed: int = 0,
        restore_fails: float = RESTORE_FAILS,
    ) -> None:
        self.rules, self.park, self.restore, self.restore_fails = rules, park, restore, restore_fails
        self.stats = MoveStats()
        self.rng = random.Random(seed + 7)
        self.rested: dict[str, float] = {}  # notebook id -> last start, resume or move
        self.moved_at: dict[str, list[float]] = {}

    def started(self, nb_id: str, t: float) -> None:
        """A notebook got a GPU (spawn or resume): no move within rest_s."""
        self.rested[nb_id] = t

    def step(
        self,
        t: float,
        state: ClusterState,
        nbs: list,
        pending: dict,
        running: dict,
        stopping: list,
        projects: dict,
        as_job,
        parked_shares,
        policy,
        rng: random.Random,
    ) -> None:
        head, pin = self._head(t, state, nbs, pending, running, projects, parked_shares, policy, rng)
        if head is None:
            return
        movable = []
        by_id = {}
        for n in nbs:
            if n.state != "held" or n.tracker is None:
                continue
            by_id[n.nb.id] = n
            idle = not n.busy(t) and n.tracker.idle_s >= IDLE_AFTER_S
            movable.append(
                Movable(
                    n.nb.id,
                    n.placement,
                    MODEL,
                    idle,
                    rested_since=self.rested.get(n.nb.id),
                    moved_at=tuple(self.moved_at.get(n.nb.id, ())),
                    memory_mib=kernel_mib(n.milli),
                )
            )
        plan = plan_moves(state, head, movable, t, self.rules, policy, rng)
        if plan is None or not plan.steps:
            return
        self.stats.plans += 1
        for step in plan.steps:
            n = by_id[step.id]
            # the move happens at a moment of this minute; a cell started before it ends waits
            begin = t + self.rng.uniform(0, 60)
            if any(
                s <= begin + LOCK_TIMEOUT_S < e for s, e in n.cells[n.cell :] if s < begin + LOCK_TIMEOUT_S
            ):
                self.stats.busy_at_switch += 1
                return  # not moved; the head waits for the next pass
            self.rested[step.id] = t
            self.moved_at.setdefault(step.id, []).append(t)
            self.moved_at[step.id] = [x for x in self.moved_at[step.id] if t - x < HOUR]
            took = move_s(n.milli, self.park, self.restore)
            failed = self.rng.random() < self.restore_fails
            if failed:  # restored on its own GPU, which it held all along (make-before-break)
                took += self.restore.for_mib(kernel_mib(n.milli))
            end = begin + took
            for s, _ in n.cells[n.cell :]:
                if s > end:
                    break
                if s >= begin:
                    self.stats.cell_delays.append(end - s)
            if failed:
                self.stats.restore_failed += 1
                return
            state.apply(step.dest)  # make-before-break: the destination first
            state.release(step.source)
            n.placement = step.dest
            self.stats.moves += 1
        pin(plan.target)

    def _head(self, t, state, nbs, pending, running, projects, parked_shares, policy, rng):
        shares = parked_shares()
        if any(p.claimed_at is not None for p in shares):
            waiting = plan_claims(state, shares, policy, rng).waiting
            if waiting:
                return waiting[0].request(), lambda target: None
        used: dict[str, int] = {}
        for j in running.values():
            used[j.project] = used.get(j.project, 0) + j.gpus * 1000

        def borrows(j) -> bool:
            return used.get(j.project, 0) + j.gpus * 1000 > projects[j.project].guarantee_milli

        # the scheduler's order, roughly: jobs within their guarantee first, then borrowers
        for j in sorted(pending.values(), key=lambda j: (borrows(j), j.submitted, j.id)):
            req = Request.for_gpus(j.gpus * 1000)
            if policy.choose(state, req, rng) is not None:
                return None, None  # the head fits: the scheduler starts it

            def pin(target, j=j):
                j.placement = target

            return req, pin
        return None, None
