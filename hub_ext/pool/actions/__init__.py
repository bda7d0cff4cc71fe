"""Train scheduling as named actions, like KAI-Scheduler's `pkg/scheduler/actions`.

One cycle (`gpupool.pool.training.schedule`) runs them in this order on one `Cycle`:

- reserve (when enabled): a big in-quota gang job that waited too long gets a node reserved;
  its free GPUs are held from everyone but backfill;
- allocate: the queue in order, each job onto free capacity;
- shrink (elastic jobs): for an in-quota job that does not fit, other projects' elastic jobs
  restart at their minimum size first;
- reclaim: for an in-quota job that does not fit, other projects' over-quota jobs are
  preempted (called by allocate at that job's turn, so the queue order decides who is served);
- preempt: a job that still does not fit stops its own project's lower-priority jobs, when it
  is within the guarantee counting only work of its priority or higher;
- consolidate: in-quota jobs still blocked get room by preempting and moving jobs on one node;
- expand (elastic jobs): when every pending job was placed, one elastic job grows onto idle GPUs
  of its node.

Beside the cycle, `move` (gpupool.parking.mover calls it, off by default) plans how idle notebooks move,
make-before-break, so that the head of the queue — a gang job, a large workspace, a resume
claim — can start.

Each action is pure: it changes only the cycle's working copy of the pool and its plan.
`victims` holds the one order in which over-quota jobs are stopped.
"""

from gpupool.pool.actions.allocate import allocate
from gpupool.pool.actions.consolidate import CONSOLIDATIONS_PER_CYCLE, consolidate
from gpupool.pool.actions.cycle import Cycle
from gpupool.pool.actions.elastic import expand, shrink
from gpupool.pool.actions.move import Movable, MovePlan, MoveRules, Step, plan_moves
from gpupool.pool.actions.preempt import preempt
from gpupool.pool.actions.reclaim import reclaim
from gpupool.pool.actions.reservation import Reservation
from gpupool.pool.actions.reserve import RESERVATIONS_PER_CYCLE, reserve
from gpupool.pool.actions.victims import reclaimable, victim_key

__all__ = [
    "CONSOLIDATIONS_PER_CYCLE",
    "RESERVATIONS_PER_CYCLE",
    "Cycle",
    "Movable",
    "MovePlan",
    "MoveRules",
    "Reservation",
    "Step",
    "allocate",
    "consolidate",
    "expand",
    "plan_moves",
    "preempt",
    "shrink",
    "reclaim",
    "reclaimable",
    "reserve",
    "victim_key",
]
