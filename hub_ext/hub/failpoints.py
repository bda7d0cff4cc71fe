"""Named crash points (etcd's gofail habit) for crash testing a real hub.

    GPUPOOL_FAILPOINT=train.start.spawned jupyterhub -f ...

makes the hub process `os._exit` the moment it reaches that point, as kill -9 would at the
worst moment: after a share is persisted but before the server starts, after a job's
process started but before its pid is written, after a cancel is written but before the
job is signalled. Unset (always, outside tests) a point costs one dictionary lookup.
"""

from __future__ import annotations

import os
import sys

ENV = "GPUPOOL_FAILPOINT"
EXIT_CODE = 86  # a crash test tells "died at the point" from any other death

POINTS = {
    "spawn.reserved": "a workspace's share is persisted; its server is not started",
    "spawn.started": "the server process runs; the share is not marked running",
    "stop.stopped": "the server is stopped; its share is not released",
    "train.start.reserved": "a job's GPUs are persisted; the job is still queued",
    "train.start.recorded": "the job is recorded running; no process yet",
    "train.start.spawned": "the job's process runs; its pid is not recorded",
    "train.resume.recorded": "a preempted job is recorded running again; no process yet",
    "train.preempt.persisted": "a preemption is written; the job has not been signalled",
    "train.cancel.persisted": "a cancel is written; the job has not been signalled",
    "move.reserved": "a move's destination is reserved; its kernel still runs on the source",
    "move.parked": "the moving kernel is checkpointed; not restored anywhere",
    "move.restored": "the moved kernel runs on the destination; the source is not released",
    "move.returning": "a failed restore: the kernel is checkpointed again on its way back to the source",
}


def reach(name: str) -> None:
    """Exit the process here when GPUPOOL_FAILPOINT names this point (comma-separated)."""
    wanted = os.environ.get(ENV)
    if wanted and name in wanted.split(","):
        sys.stderr.write(f"gpupool: failpoint {name} reached, exiting\n")
        sys.stderr.flush()
        os._exit(EXIT_CODE)
