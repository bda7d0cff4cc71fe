"""Moving a kernel's GPU memory from GPU A to GPU B of the same model, and back when that fails.

The kernel side of one move (gpupool.pool.actions.move plans it, gpupool.parking.mover reserves B
before and releases A after): lock and checkpoint every process on A (park), restore them
onto B with A's UUID remapped to B's, unlock. A process whose GPU is busy is never moved: its
lock times out and whatever was parked runs on A again ("aborted"). When the restore onto B
fails, the processes already on B are checkpointed again and all are restored onto A
("returned"); only when that fails too is the kernel lost, with both reasons.

`on_phase(name, pids)` is called when a phase is done — "parked", "returning", "restored" —
so the caller persists it (and tests kill the hub there); `recover` finishes a move a hub
crash interrupted from the last phase persisted, so that every process ends running on one
GPU: forward to B once parked, back to A once returning.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

from gpupool.gpu.parking import ParkingBackend, ParkingError, park_process, resume_process
from gpupool.vocab.kinds import MovePhase

Result = Literal[MovePhase.MOVED, MovePhase.RETURNED, MovePhase.ABORTED, MovePhase.LOST]
PhaseHook = Callable[[MovePhase, list[int]], None]


@dataclass(frozen=True)
class Outcome:
    result: Result
    reason: str = ""
    pids: tuple[int, ...] = field(default=())  # the processes that were parked (what moved)


def _nothing(phase: MovePhase, pids: list[int]) -> None:
    pass


def move_processes(
    backend: ParkingBackend,
    pids: Sequence[int],
    gpu_map: Mapping[str, str],
    lock_timeout_ms: int,
    on_phase: PhaseHook = _nothing,
) -> Outcome:
    """Park `pids` on their GPU, restore them with `gpu_map` (A's UUID -> B's), unlock."""
    parked: list[int] = []
    try:
        for pid in pids:
            if park_process(backend, pid, lock_timeout_ms):
                parked.append(pid)
    except ParkingError as err:
        try:
            for pid in parked:  # who was parked runs on its own GPU again
                resume_process(backend, pid)
        except ParkingError as again:
            return Outcome(
                MovePhase.LOST,
                f"could not park ({err}), nor restore what was parked ({again})",
                tuple(parked),
            )
        return Outcome(MovePhase.ABORTED, f"could not park: {err}")
    if not parked:
        return Outcome(MovePhase.MOVED)  # no CUDA context anywhere: the share alone moves
    on_phase(MovePhase.PARKED, parked)
    return _forward(backend, parked, gpu_map, on_phase)


def _forward(
    backend: ParkingBackend, parked: list[int], gpu_map: Mapping[str, str], on_phase: PhaseHook
) -> Outcome:
    """Restore every checkpointed process onto B, then unlock all; back to A on failure."""
    try:
        for pid in parked:
            if backend.state(pid) == "checkpointed":
                backend.restore(pid, gpu_map)
    except ParkingError as err:
        return _back(backend, parked, f"restore on the destination failed: {err}", on_phase)
    return _unlock(backend, parked, on_phase, MovePhase.RESTORED, MovePhase.MOVED, "")


def _back(backend: ParkingBackend, parked: list[int], why: str, on_phase: PhaseHook) -> Outcome:
    """Every process back onto its own GPU: those already restored onto B are checkpointed
    again first, and only then is "returning" persisted (so a restart knows that a locked
    process is on A)."""
    try:
        for pid in parked:
            if backend.state(pid) == "locked":
                backend.checkpoint(pid)
    except ParkingError as err:
        return Outcome(
            MovePhase.LOST, f"{why}; taking it off the destination failed too: {err}", tuple(parked)
        )
    on_phase(MovePhase.RETURNING, parked)
    return _return(backend, parked, why, on_phase)


def _return(backend: ParkingBackend, parked: list[int], why: str, on_phase: PhaseHook) -> Outcome:
    try:
        for pid in parked:
            if backend.state(pid) == "checkpointed":
                backend.restore(pid, None)
    except ParkingError as err:
        return Outcome(MovePhase.LOST, f"{why}; restoring it on its own GPU failed too: {err}", tuple(parked))
    return _unlock(backend, parked, on_phase, MovePhase.RETURNED, MovePhase.RETURNED, why)


def _unlock(
    backend: ParkingBackend,
    parked: list[int],
    on_phase: PhaseHook,
    phase: MovePhase,
    result: Result,
    why: str,
) -> Outcome:
    try:
        for pid in parked:
            if backend.state(pid) == "locked":
                backend.unlock(pid)
    except ParkingError as err:
        return Outcome(MovePhase.LOST, f"{why + '; ' if why else ''}unlock failed: {err}", tuple(parked))
    on_phase(phase, parked)
    return Outcome(result, why, tuple(parked))


def recover(
    backend: ParkingBackend,
    pids: Sequence[int],
    phase: str,
    gpu_map: Mapping[str, str],
    on_phase: PhaseHook = _nothing,
) -> Outcome:
    """Finish a move from the last phase persisted before a crash (see the module's docstring).
    `phase` "reserved": nothing was parked for sure, so whatever is locked or checkpointed is
    on A and runs there again."""
    pids = [p for p in pids if backend.state(p) != "none"]
    if phase == MovePhase.RESERVED:
        try:
            for pid in pids:
                resume_process(backend, pid)
        except ParkingError as err:
            return Outcome(
                MovePhase.LOST, f"the hub restarted while parking it; restoring it failed: {err}", tuple(pids)
            )
        return Outcome(MovePhase.ABORTED, "the hub restarted before the move began")
    if phase == MovePhase.PARKED:
        return _forward(backend, pids, gpu_map, on_phase)
    if phase == MovePhase.RETURNING:
        return _return(backend, pids, "the restore on the destination failed", on_phase)
    if phase in (MovePhase.RESTORED, MovePhase.RETURNED):
        done: Result = MovePhase.MOVED if phase == MovePhase.RESTORED else MovePhase.RETURNED
        return _unlock(backend, pids, on_phase, MovePhase(phase), done, "")
    raise ValueError(f"unknown move phase {phase!r}")
