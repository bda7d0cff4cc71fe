"""The words the hub's records are told in, outside a train job's life (gpupool.vocab.states):
the kinds of the events in `gpupool_events`, what holds an allocation and its state and the phases of a
workspace's move. String-valued enums, stored in the database as the same strings they always
were (no migration), compared and serialised as plain strings.

Pure and stdlib-only: the culler service imports it too, without the store's SQLAlchemy.
"""

from __future__ import annotations

from enum import StrEnum

__all__ = ["ACTIVE_PHASES", "CULLER_EVENTS", "AllocationState", "EventKind", "MovePhase", "WorkloadKind"]


class EventKind(StrEnum):
    """The kinds of the events that are not a train job's (`Event.kind`; those are JobEvent)."""

    # a share held and given back: their data carry the interval usage accounting reads
    ALLOCATE = "allocate"
    RELEASE = "release"
    REFUSE = "refuse"  # a workspace's start refused (quota, no room)
    # parking (gpupool.parking.service); UNPARK carries the parked interval, whole
    PARK = "park"  # also the culler's report of a park
    PARK_FAILED = "park-failed"
    RESUME = "resume"  # the same word as a train job's resume (JobEvent.RESUME)
    RESUME_FAILED = "resume-failed"
    UNPARK = "unpark"
    # a move of an idle workspace to another GPU (gpupool.parking.mover): MOVE when it moved, else by its end
    MOVE = "move"
    MOVE_RETURNED = "move-returned"
    MOVE_ABORTED = "move-aborted"
    MOVE_LOST = "move-lost"
    # what the culler service reports (POST api/culler/report)
    WARN = "warn"
    CULL = "cull"
    MEMORY = "memory"  # over its GPU memory share: warned, or its kernels restarted
    EXTEND = "extend"  # a session extended once on its owner's request
    HIBERNATE = "hibernate"  # a user hibernated their own server (%gpupool hibernate)
    # the kernel's OOM killer ended a workspace's server (over its host memory limit, gpupool.contain)
    OOM = "oom"
    # admins' changes
    QUOTA = "quota"
    BUDGET = "budget"  # a budget top-up or exemption granted or ended
    SETTING_SKIPPED = "setting-skipped"  # a stored setting no longer applies


# the kinds the culler service may report (checked by gpupool.api.culler)
CULLER_EVENTS = (EventKind.WARN, EventKind.CULL, EventKind.MEMORY, EventKind.PARK)


class WorkloadKind(StrEnum):
    """What holds a share (`Allocation.kind`, `Workload.kind`; usage accounting's `Held.kind`)."""

    BUILD = "build"  # a build workspace: a notebook server
    TRAIN = "train"  # a train job
    MOVE = "move"  # the destination a moving workspace holds until it switches (gpupool.parking.mover)


class AllocationState(StrEnum):
    """`Allocation.state`: held for a workload that is starting, or by one that runs."""

    RESERVED = "reserved"
    RUNNING = "running"


class MovePhase(StrEnum):
    """`Move.phase`: how far a workspace's move got (gpupool.gpu.moving writes it as it passes),
    then how it ended."""

    RESERVED = "reserved"  # the destination is held
    PARKED = "parked"  # its processes are checkpointed
    RETURNING = "returning"  # going back to the source GPU
    RESTORED = "restored"  # restored on the destination (or back on the source)
    # ends
    MOVED = "moved"
    RETURNED = "returned"
    ABORTED = "aborted"
    LOST = "lost"

    @property
    def event(self) -> EventKind:
        """The event a move that ended so records."""
        return EventKind.MOVE if self is MovePhase.MOVED else EventKind(f"move-{self.value}")


# a move the hub must finish (after a crash, at start-up)
ACTIVE_PHASES = (MovePhase.RESERVED, MovePhase.PARKED, MovePhase.RETURNING, MovePhase.RESTORED)
