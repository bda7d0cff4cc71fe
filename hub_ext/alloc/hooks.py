"""What the pool manager asks of the services built on it (training, usage accounting, the
mover, the published GPU files), as one object given to `PoolManager` by its constructor.

The services need the pool and the pool calls back into them: a true cycle. The pool is built
first with `ServiceHooks`, which reads the services when it is asked, from whatever the
composition root hands it (`gpupool.wiring.root.GPUPoolHub.serving`); nothing is attached to the pool
after it is built. `PoolHooks` itself is the answer of a pool without services: every question
answered as if that service were off (no budget, no train jobs to preempt, no moves).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from gpupool.alloc.manager import Workload
    from gpupool.contain.follow import WorkspaceDevices
    from gpupool.gpu.env_files import GPUEnvFiles
    from gpupool.parking.mover import MoverService
    from gpupool.pool import Request
    from gpupool.train.service import TrainingService
    from gpupool.usage.service import UsageService


class PoolHooks:
    """A pool with no service behind it. Each method is one question the pool (or a spawner, the
    parking pass, the mover, through `pool.hooks`) asks while it serves a build workspace."""

    def admit(self, w: Workload, groups: list[str], milli: int) -> None:
        """Raise a PoolError when a new workspace of `milli` is over a GPU-hour budget."""

    def form_notes(self, owner: str, groups: list[str]) -> list[str]:
        """What the spawn form tells a user first (a budget near or over its limit)."""
        return []

    def room_for_build(self, request: Request, pools: tuple[str, ...] = ()) -> list[str] | None:
        """The train jobs a build of `request` would preempt to fit ([]: room is already being
        freed), None when train jobs can make no room. Changes nothing."""
        return None

    def make_room_for_build(self, w: Workload, request: Request, pools: tuple[str, ...] = ()) -> str:
        """Preempt the train jobs borrowing GPUs until `request` fits: what is being done, for the
        spawn page ("preempting job X of project P, ~20 s"); "" when they cannot."""
        return ""

    def build_reserved(self, w: Workload) -> None:
        """The workspace holds its share: room held for it by training is no longer needed."""

    def room_by_moving(self, request: Request) -> int | None:
        """How many idle notebooks would move for a new workspace of `request` (None: none can)."""
        return None

    def make_room_by_moving(
        self, w: Workload, request: Request, groups: list[str], pools: tuple[str, ...]
    ) -> str | None:
        """Start moving idle notebooks for a spawn that fits nowhere: what its page says while it
        waits, or None (no moves can: the spawn is refused)."""
        return None

    def build_changed(self, owner: str, name: str) -> None:
        """A workspace's GPUs may have changed (committed): publish them for its new processes."""


@dataclass(frozen=True)
class Services:
    """The services a pool's questions go to (None: that one is off)."""

    training: TrainingService | None = None  # the embedded engine, when it shares the pool's GPUs
    usage: UsageService | None = None
    mover: MoverService | None = None
    gpu_files: GPUEnvFiles | None = None
    devices: WorkspaceDevices | None = None  # each workspace's device rules, where they are enforced


class ServiceHooks(PoolHooks):
    """The pool's questions answered by the services `services()` returns at the time of asking
    (None, or a service that is None: answered as if off, e.g. while the hub still starts)."""

    def __init__(self, services: Callable[[], Services | None]) -> None:
        self._services = services

    def _get(self) -> Services:
        return self._services() or Services()

    def admit(self, w: Workload, groups: list[str], milli: int) -> None:
        usage = self._get().usage
        if usage is not None:
            usage.check(w.owner, groups, milli, w.kind)

    def form_notes(self, owner: str, groups: list[str]) -> list[str]:
        usage = self._get().usage
        return usage.form_notes(owner, groups) if usage is not None else []

    def room_for_build(self, request: Request, pools: tuple[str, ...] = ()) -> list[str] | None:
        training = self._get().training
        return training.room_for_build(request, pools=pools) if training is not None else None

    def make_room_for_build(self, w: Workload, request: Request, pools: tuple[str, ...] = ()) -> str:
        training = self._get().training
        return training.make_room_for_build(w, request, pools=pools) if training is not None else ""

    def build_reserved(self, w: Workload) -> None:
        training = self._get().training
        if training is not None:
            training.build_holds.pop((w.owner, w.name), None)
            training.build_victims.pop((w.owner, w.name), None)

    def room_by_moving(self, request: Request) -> int | None:
        mover = self._get().mover
        return mover.room_for_spawn(request) if mover is not None else None

    def make_room_by_moving(
        self, w: Workload, request: Request, groups: list[str], pools: tuple[str, ...]
    ) -> str | None:
        mover = self._get().mover
        return mover.make_room_for_spawn(w, request, groups, pools) if mover is not None else None

    def build_changed(self, owner: str, name: str) -> None:
        services = self._get()
        if services.devices is not None:  # the new GPU opens before the file names it
            services.devices.follow(owner, name)
        if services.gpu_files is not None:
            services.gpu_files.publish(owner, name)
