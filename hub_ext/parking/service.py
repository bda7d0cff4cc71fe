"""Parking in the hub process: checkpoint a workspace's kernels, release its share, and give
it back when the kernel asks (the rule that orders claims is in gpupool.pool.parking).

Park: every process of the server (kernels are its children) that holds a CUDA context is
locked and checkpointed through the parking backend; the parked row is written first, then
the allocation released, so a crash in between never loses the claim. Resume: the claim is
stamped, claims are placed in order (`grant`), and each granted workspace is restored —
onto the same GPU when it is free, else onto another of the same model with its UUID
remapped — and unlocked; only then is its parked row deleted.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sqlalchemy import select
from traitlets import Enum, Float, Int
from traitlets.config import Config, Configurable

from gpupool.alloc.manager import PoolManager, Workload
from gpupool.gpu.parking import (
    Delays,
    ParkingBackend,
    ParkingError,
    make_backend,
    park_process,
    resume_process,
)
from gpupool.pool import format_gpus
from gpupool.pool.parking import ParkedShare, plan_claims
from gpupool.settings.config import GPUPool
from gpupool.store import Parked
from gpupool.vocab.kinds import EventKind, WorkloadKind

if TYPE_CHECKING:
    from gpupool.store import Allocation

log = logging.getLogger("gpupool.parking.service")


class GPUParking(Configurable):
    """How the hub parks idle workspaces' GPUs (the culler decides when: IdleCuller.park_after_s)."""

    backend = Enum(
        ("auto", "cuda", "virtual"),
        "auto",
        config=True,
        help="""How processes are parked:
        cuda (the driver's process checkpoint API, driver r570+, needs cuda-bindings), virtual
        (modelled, for virtual GPUs and tests) or auto (virtual when the pool's GPUs are virtual).
        Example::

            c.GPUParking.backend = "cuda"
        """,
    )
    lock_timeout_s = Float(
        10.0,
        config=True,
        help="""How long locking a kernel may wait for its
        running GPU work before parking gives up (the workspace then stays on its GPU). Example::

            c.GPUParking.lock_timeout_s = 30
        """,
    )
    resume_wait_s = Float(
        300.0,
        config=True,
        help="""How long a kernel waits for its GPU to come back
        before it tells the user who holds the GPUs and lets them work on the CPU. Example::

            c.GPUParking.resume_wait_s = 120
        """,
    )
    grant_interval_s = Float(
        2.0,
        config=True,
        help="""Seconds between checks for capacity for waiting
        resume claims. Example::

            c.GPUParking.grant_interval_s = 5
        """,
    )
    virtual_kernel_mib = Int(
        2048,
        config=True,
        help="""Virtual backend: GPU memory each kernel is
        modelled to hold (sets the modelled park and resume times). Example::

            c.GPUParking.virtual_kernel_mib = 10240
        """,
    )
    virtual_fixed_s = Float(
        Delays.fixed_s,
        config=True,
        help="""Virtual backend: fixed seconds per
        checkpoint or restore of a process. Example::

            c.GPUParking.virtual_fixed_s = 0.05
        """,
    )
    virtual_per_gib_s = Float(
        Delays.per_gib_s,
        config=True,
        help="""Virtual backend: seconds per GiB
        copied between GPU and host. Example::

            c.GPUParking.virtual_per_gib_s = 0.08
        """,
    )


class ParkingService:
    def __init__(
        self,
        pool: PoolManager,
        backend: ParkingBackend,
        cfg: GPUParking | None = None,
        pids_of: Callable[[int], set[int]] | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        from gpupool.gpu.proctree import descendants

        self.pool, self.backend, self.cfg = pool, backend, cfg or GPUParking()
        self.pids_of = pids_of or descendants
        self.clock = clock
        self._restoring: set[tuple[str, str]] = set()
        self._parking: set[tuple[str, str]] = set()
        self._tasks: set[asyncio.Task[object]] = set()
        self.failures: dict[tuple[str, str], str] = {}
        self.moving: dict[
            tuple[str, str], str
        ] = {}  # workspaces gpupool.parking.mover is moving, with what to say

    # --- park -----------------------------------------------------------------
    def park(self, owner: str, name: str) -> dict[str, object]:
        """Checkpoint the workspace's CUDA processes and release its share (idempotent).
        Synchronous, for tools and tests; the API uses `park_async`."""
        begun = self._park_begin(owner, name)
        if isinstance(begun, dict):
            return begun
        try:
            done = self._checkpoint_all(*begun)
        finally:
            self._parking.discard((owner, name))
        return self._park_end(begun[0], done)

    async def park_async(self, owner: str, name: str) -> dict[str, object]:
        """As `park`, with the driver's work (a lock may wait for running kernels, a checkpoint
        copies GBs) off the hub's event loop. A workspace being moved (gpupool.parking.mover) is parked
        once the move is over (seconds), not refused: a refused park makes the culler stop it."""
        for _ in range(600):
            if (owner, name) not in self.moving:
                break
            await asyncio.sleep(0.1)
        begun = self._park_begin(owner, name)
        if isinstance(begun, dict):
            return begun
        try:
            done = await asyncio.get_running_loop().run_in_executor(None, self._checkpoint_all, *begun)
        finally:
            self._parking.discard((owner, name))
        return self._park_end(begun[0], done)

    def _park_begin(self, owner: str, name: str):
        w = Workload(WorkloadKind.BUILD, owner, name)
        row = self.pool.allocation(w)
        parked = self._parked(owner, name)
        if row is None:
            if parked is not None:
                return self.status(owner, name)
            raise LookupError(f"no running GPU workspace {name or 'default'!r} of {owner}")
        if (
            parked is not None
            or (owner, name) in self._restoring
            or (owner, name) in self._parking
            or (owner, name) in self.moving
        ):
            raise ValueError(
                f"{owner}/{name or 'default'} is being parked, resumed or moved; try again later"
            )
        if not row.pid:
            # without the server's process (Kubernetes pods live on other nodes) nothing can be
            # checkpointed, and releasing the share would leave its memory on the GPU
            raise ParkingError(f"{w.label}: its processes are not on this machine; it keeps its GPU")
        self._parking.add((owner, name))
        return row, sorted(self.pids_of(row.pid))

    def _checkpoint_all(self, row: Allocation, pids: list[int]) -> list[int]:
        """Lock and checkpoint each process with a CUDA context; all or nothing."""
        done: list[int] = []
        try:
            for pid in pids:
                if park_process(self.backend, pid, int(self.cfg.lock_timeout_s * 1000)):
                    done.append(pid)
        except ParkingError as err:
            for pid in done:  # who was parked runs on the GPU again
                resume_process(self.backend, pid)
            self.pool.store.record(
                EventKind.PARK_FAILED,
                f"build {row.owner}/{row.name or 'default'} stays on its GPU: {err}",
                owner=row.owner,
                name=row.name,
            )
            raise
        return done

    def _park_end(self, row: Allocation, done: list[int]) -> dict[str, object]:
        """The parked row first, then the release: a crash in between never loses the claim."""
        w = Workload(WorkloadKind.BUILD, row.owner, row.name)
        node = self.pool.inventory.node(row.node)
        with self.pool.store.session() as s:
            s.add(
                Parked(
                    owner=row.owner,
                    name=row.name,
                    node=row.node,
                    gpus=list(row.gpus),
                    gpu_uuids=[node.gpus[g].uuid for g in row.gpus],
                    gpu_milli=row.gpu_milli,
                    model=node.model,
                    groups=list(row.groups or []),
                    pids=done,
                    server_pid=row.pid,
                    parked_at=self.clock(),
                    claimed_at=None,
                )
            )
        self.pool.release(w, reason=f"parked ({len(done)} process(es) checkpointed)", keep_parked=True)
        self.pool.store.record(
            EventKind.PARK,
            f"{w.label} parked: {format_gpus(row.total_milli)} free for others,"
            f" {len(done)} process(es) checkpointed",
            owner=row.owner,
            name=row.name,
            milli=row.total_milli,
        )
        return self.status(row.owner, row.name)

    # --- resume ---------------------------------------------------------------
    def claim(self, owner: str, name: str) -> dict[str, object]:
        """The kernel (or the Resume button) asks for the GPU back: stamp the claim, grant
        what fits. Returns the workspace's state; the restore runs in the background."""
        if self._parked(owner, name) is None:
            if self.pool.allocation(Workload(WorkloadKind.BUILD, owner, name)) is None:
                raise LookupError(f"no GPU workspace {name or 'default'!r} of {owner}")
            status = self.status(owner, name)
            if status["state"] == "failed":
                self.failures.pop((owner, name), None)  # a kernel lost in a move: said once, at the next cell
            return status
        with self.pool.store.session() as s:
            row = s.scalar(select(Parked).filter_by(owner=owner, name=name))
            if row is not None and row.claimed_at is None:
                row.claimed_at = self.clock()
        self.failures.pop((owner, name), None)
        self.grant()
        return self.status(owner, name)

    def grant(self) -> list[tuple[str, str]]:
        """Place waiting claims in order; start restoring each placed one. Waiting claims ask
        the training pool to make room, as a spawn does."""
        waiting = self.pool.parked_without_gpu()
        if not any(p.claimed_at is not None for p in waiting):
            self._restore_placed()
            return []
        plan = plan_claims(self.pool.state, waiting, self.pool.policy, self.pool.rng)
        granted = []
        for claim, spot in plan.granted:
            w = Workload(WorkloadKind.BUILD, claim.owner, claim.name)
            self.pool.reserve_at(w, spot, claim.groups)
            self.pool.hooks.build_reserved(w)
            granted.append(claim.key)
        for claim in plan.waiting:
            self.pool.hooks.make_room_for_build(
                Workload(WorkloadKind.BUILD, claim.owner, claim.name), claim.request()
            )
        self._restore_placed()
        return granted

    def _restore_placed(self) -> None:
        """Start the restore of every parked workspace that holds its allocation again."""
        for p in self.pool.parked_shares():
            w = Workload(WorkloadKind.BUILD, p.owner, p.name)
            alloc = self.pool.allocation(w)
            if alloc is None or p.key in self._restoring or p.key in self.failures:
                continue
            node = self.pool.inventory.node(alloc.node)
            row = self._parked(p.owner, p.name)
            new = [node.gpus[g].uuid for g in alloc.gpus]
            gpu_map = dict(zip(row.gpu_uuids, new, strict=False)) if row is not None else {}
            remap = {old: new for old, new in gpu_map.items() if old != new}
            self._restoring.add(p.key)
            try:
                loop = asyncio.get_running_loop()
            except RuntimeError:  # outside the hub's loop (tools, unit tests): restore now
                self._finish(
                    p, remap, row.server_pid if row else None, self._restore_processes(p.pids, remap)
                )
                continue
            task = loop.create_task(self._restore_async(p, remap, row.server_pid if row else None))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _restore_async(self, p: ParkedShare, remap: dict[str, str], server_pid: int | None) -> None:
        # the driver copies GBs back to the GPU: off the hub's event loop
        error = await asyncio.get_running_loop().run_in_executor(None, self._restore_processes, p.pids, remap)
        self._finish(p, remap, server_pid, error)

    def _restore_processes(self, pids: tuple[int, ...], remap: dict[str, str]) -> str:
        try:
            for pid in pids:
                resume_process(self.backend, pid, remap)
        except ParkingError as err:
            return str(err)
        return ""

    def _finish(self, p: ParkedShare, remap: dict[str, str], server_pid: int | None, error: str) -> None:
        w = Workload(WorkloadKind.BUILD, p.owner, p.name)
        self._restoring.discard(p.key)
        if error:
            # keep the share (the kernel is locked and needs it) and say so; an admin may stop it
            self.failures[p.key] = error
            self.pool.store.record(
                EventKind.RESUME_FAILED,
                f"{w.label} could not be restored: {error}",
                owner=p.owner,
                name=p.name,
            )
            log.error("resume of %s failed: %s", w.label, error)
            return
        self.pool.forget_parked(w)
        self.pool.mark_running(w, server_pid)
        waited = self.clock() - (p.claimed_at or self.clock())
        moved = f", remapped {remap}" if remap else ""
        self.pool.store.record(
            EventKind.RESUME,
            f"{w.label} resumed after {waited:.1f} s{moved}",
            owner=p.owner,
            name=p.name,
            waited_s=waited,
        )

    # --- what the user sees ---------------------------------------------------
    def status(self, owner: str, name: str, sees_all: bool = False) -> dict[str, Any]:
        row = self._parked(owner, name)
        alloc = self.pool.allocation(Workload(WorkloadKind.BUILD, owner, name))
        out: dict[str, Any] = {"owner": owner, "name": name, "wait_limit_s": self.cfg.resume_wait_s}
        if row is None:
            out["state"] = "running" if alloc is not None else "none"
            if (owner, name) in self.moving:  # its kernel's CUDA calls wait for the move's restore
                out.update(state="moving", message=self.moving[(owner, name)])
            elif alloc is not None and (owner, name) in self.failures:
                out.update(state="failed", message=self.failures[(owner, name)])
            return out
        out.update(
            parked_at=row.parked_at,
            claimed_at=row.claimed_at,
            milli=len(row.gpus) * row.gpu_milli,
            model=row.model,
            message="GPU parked — it comes back when you run a cell",
        )
        if (owner, name) in self.failures:
            out.update(state="failed", message=f"GPU could not be restored: {self.failures[(owner, name)]}")
        elif alloc is not None:
            out.update(state="resuming", message="GPU found: restoring your kernel's GPU memory")
        elif row.claimed_at is None:
            out["state"] = "parked"
        else:
            claims = sorted(
                (p for p in self.pool.parked_without_gpu() if p.claimed_at is not None),
                key=lambda p: (p.claimed_at, p.owner, p.name),
            )
            position = next((i for i, p in enumerate(claims) if p.key == (owner, name)), 0) + 1
            waited = max(0.0, self.clock() - row.claimed_at)
            holders = self.holders(row.model, owner, sees_all)
            out.update(
                state="waiting",
                position=position,
                waited_s=waited,
                holders=holders[:50],
                message=f"waiting for a {row.model} GPU ({format_gpus(out['milli'])}) for {waited:.0f} s;"
                f" {position - 1} earlier request(s); held by: {_some(holders)}",
            )
        return out

    def holders(self, model: str, caller: str, sees_all: bool) -> list[str]:
        """Who holds the GPUs of a model: workspaces and train jobs, other users' names hidden."""
        out = []
        for a in self.pool.store.allocations():
            if self.pool.inventory.node(a.node).model != model:
                continue
            who = a.owner if sees_all or a.owner == caller else "another user"
            what = (
                "train job" if a.kind == WorkloadKind.TRAIN else "workspace"
            )  # "move": a workspace's destination
            out.append(f"{who}'s {what} ({format_gpus(a.total_milli)})")
        return out

    def _parked(self, owner: str, name: str) -> Parked | None:
        with self.pool.store.session() as s:
            return s.scalar(select(Parked).filter_by(owner=owner, name=name))


def _some(items: list[str], shown: int = 5) -> str:
    """A few names for a message; a big cluster's full list helps nobody."""
    if not items:
        return "nobody"
    more = f" and {len(items) - shown} more" if len(items) > shown else ""
    return ", ".join(items[:shown]) + more


def build_parking(config: Config, pool: PoolManager, state_folder: str) -> ParkingService:
    cfg = GPUParking(config=config)
    kind = cfg.backend
    if kind == "auto":
        virtual = any(g.virtual for n in pool.inventory.nodes for g in n.gpus)
        kind = "virtual" if virtual else "cuda"
    if kind == "cuda" and GPUPool(config=config).mps_pipe_directory:
        # seen on an H100 with driver 580: cuCheckpointProcessLock answers CUDA_ERROR_NOT_SUPPORTED
        # for an MPS client, so every park would fail; say so once instead of at every idle workspace
        raise ParkingError(
            "the CUDA driver cannot checkpoint CUDA MPS clients, and"
            " c.GPUPool.mps_pipe_directory is set: idle workspaces are culled, not parked"
        )
    delays = Delays(cfg.virtual_fixed_s, cfg.virtual_per_gib_s)
    backend = make_backend(kind, str(Path(state_folder) / "parking"), delays, cfg.virtual_kernel_mib)
    return ParkingService(pool, backend, cfg)
