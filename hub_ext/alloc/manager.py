"""The one owner of allocation state, living in the hub process.

Every reserve and release goes through here: quota check, placement and the database
write happen in one synchronous call, so concurrent spawns on the hub's event loop
cannot interleave between "check" and "take". The in-memory ClusterState is rebuilt
from the database at start-up, and `reconcile` drops what is no longer running.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
import os
import random
import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, cast

from sqlalchemy import Table, bindparam, insert, select, update
from sqlalchemy.orm import Session

from gpupool.alloc.hooks import PoolHooks
from gpupool.host.backup import MADE_SETTING as BACKUP_MADE
from gpupool.pool import (
    BuildQuotaPolicy,
    ClusterState,
    Holding,
    Inventory,
    NoCapacity,
    Placement,
    Request,
    format_gpus,
)
from gpupool.pool.errors import DiskReserve, HubStopping, RoomBeingFreed
from gpupool.pool.parking import ParkedShare, newcomer_view, quota_holdings
from gpupool.pool.placement import Policy
from gpupool.pool.pools import NodePool, allowed_pools, choose_in_pools
from gpupool.store import Allocation, Event, Parked, Store
from gpupool.store.models import utcnow
from gpupool.vocab.kinds import AllocationState, EventKind, WorkloadKind

_TABLE = cast(Table, Allocation.__table__)  # the ORM types it as a FromClause
_PARKED_ROWS = select(cast(Table, Parked.__table__)).order_by(Parked.id)
_BUILD_ROWS = (
    select(_TABLE)
    .where(_TABLE.c.kind == WorkloadKind.BUILD, _TABLE.c.owner == bindparam("owner"))
    .order_by(_TABLE.c.id)
)
_INSERT_ALLOCATION = insert(_TABLE)
_INSERT_EVENT = insert(cast(Table, Event.__table__))
_MARK_RUNNING = (
    update(_TABLE)
    .where(
        _TABLE.c.kind == bindparam("w_kind"),
        _TABLE.c.owner == bindparam("w_owner"),
        _TABLE.c.name == bindparam("w_name"),
    )
    .values(state=AllocationState.RUNNING, pid=bindparam("w_pid"))
)

log = logging.getLogger("gpupool")


@dataclass(frozen=True)
class Workload:
    kind: WorkloadKind
    owner: str
    name: str

    def __post_init__(self) -> None:
        object.__setattr__(self, "kind", WorkloadKind(self.kind))  # a kind read as text: checked

    @classmethod
    def of(cls, row: Allocation) -> Workload:
        """The workload an allocation row is held for."""
        return cls(WorkloadKind(row.kind), row.owner, row.name)

    @property
    def label(self) -> str:
        name = self.name or "default"
        return f"{self.kind} {self.owner}/{name}"


class PoolManager:
    def __init__(
        self,
        inventory: Inventory,
        store: Store,
        quotas: BuildQuotaPolicy,
        policy: Policy,
        seed: int = 0,
        node_pools: dict[str, NodePool] | None = None,
        skipped_settings: dict[str, str] | None = None,
        hooks: PoolHooks | None = None,
    ) -> None:
        self.inventory = inventory
        self.store = store
        self.quotas = quotas
        self.policy = policy
        # c.TrainPool.node_pools, for build workspaces too
        self.node_pools: dict[str, NodePool] = dict(node_pools or {})
        # stored admin settings that no longer validate: why
        self.skipped_settings: dict[str, str] = dict(skipped_settings or {})
        self.rng = random.Random(seed)
        self.state = ClusterState(inventory)
        # held by every change of `state` made here: reserve_build_async runs in a worker thread
        self.lock = threading.RLock()
        # what the pool asks of the services built on it (training, usage, mover, GPU files)
        self.hooks = hooks if hooks is not None else PoolHooks()
        # spawns waiting in their spawner for idle notebooks to move (gpupool.parking.mover), by workspace
        self.spawns_waiting: set[tuple[str, str]] = set()
        # a restored backup: when it was made, and the workloads it held then that this hub has not
        # yet seen running: their shares close at the backup's time (nobody is charged for the time
        # between the backup and the restart; gpupool.host.backup)
        # why nothing new may start (the hub is stopping); "" while it serves
        self.stopping = ""
        # MiB kept free on the databases' disk (c.GPUPool.min_free_disk_mib): below it nothing starts
        self.min_free_mib = 0
        self.backup_made: float | None = None
        self.unseen: set[tuple[str, str, str]] = set()
        self._load()

    # --- start-up ------------------------------------------------------------
    def _load(self) -> None:
        """Put every persisted allocation back into the state, dropping rows that no
        longer fit the inventory (a GPU removed while the hub was down)."""
        made = (self.store.get_setting(BACKUP_MADE) or {}).get("made")
        if isinstance(made, int | float) and not isinstance(made, bool):
            self.backup_made = float(made)
        for row in self.store.allocations():
            if self.backup_made is not None:
                self.unseen.add((row.kind, row.owner, row.name))
            try:
                self.state.apply(_placement(row))
            except Exception as err:  # noqa: BLE001 - a bad row must not stop the hub
                log.warning("dropping allocation %s (%s): %s", row.id, _label(row), err)
                self._delete(row.id, reason=f"no longer fits the inventory: {err}")

    def disk_refusal(self) -> str:
        """Why nothing may start now: the disk of the (SQLite) databases is down to the reserve; ""
        when it is not (or there is no reserve, or the database is a server's). One statvfs."""
        url = self.store.engine.url
        if not self.min_free_mib or url.get_backend_name() != "sqlite" or not url.database:
            return ""
        st = os.statvfs(os.path.dirname(os.path.abspath(url.database)))
        free = st.f_bavail * st.f_frsize // 2**20
        if free >= self.min_free_mib:
            return ""
        return (
            f"the disk that holds the hub's databases has {free} MiB free, under the"
            f" {self.min_free_mib} MiB it keeps (c.GPUPool.min_free_disk_mib): no server or job starts"
            " until an admin frees space there (users' files on that disk may have filled it)"
        )

    def seen_running(self, w: Workload) -> None:
        """The hub found `w` running after its start: its share stays open, charged as it runs."""
        self.unseen.discard((w.kind, w.owner, w.name))

    def started(self) -> None:
        """The start-up reconcile is over: a restored backup's time is no longer needed in the
        database (a later restart must not close shares at it); the workloads not yet seen keep it."""
        if self.backup_made is not None:
            self.store.delete_setting(BACKUP_MADE)

    # --- queries -------------------------------------------------------------
    def holdings(
        self, owner: str, kind: WorkloadKind = WorkloadKind.BUILD, parked: list[ParkedShare] | None = None
    ) -> list[Holding]:
        """What `owner` holds, as the quota counts it: every share on a GPU and, for build
        workspaces, every parked share (it resumes without asking the quota again). The form,
        `%gpupool`, the status item and the home page all read this, so none shows less than the
        quota check counts. `parked`: the parked shares without a GPU, where the caller read them."""
        held = [Holding(r.name, r.total_milli) for r in self.store.allocations(owner=owner, kind=kind)]
        if kind == WorkloadKind.BUILD:
            held += quota_holdings(self.parked_without_gpu() if parked is None else parked, owner)
        return held

    def allocation(self, w: Workload) -> Allocation | None:
        rows = self.store.allocations(kind=w.kind, owner=w.owner, name=w.name)
        return rows[0] if rows else None

    def group_usage(
        self, groups_of: Mapping[str, Iterable[str]] | None = None, only: Iterable[str] | None = None
    ) -> dict[str, int]:
        """Build GPUs held per group. `groups_of`: each holder's groups as the hub has them now,
        so a member added since their spawn counts for the group and one removed no longer
        does; a holder it does not name counts in the groups recorded at the spawn. `only`:
        just these groups, and nothing read when none of them has a total to check (a spawn of
        a user in no capped group costs no scan of every workspace)."""
        wanted = None if only is None else set(only)
        if wanted is not None and not wanted & set(self.quotas.group_totals_milli):
            return {}

        def add(owner: str, recorded: Iterable[str] | None, milli: int) -> None:
            now = groups_of[owner] if groups_of is not None and owner in groups_of else recorded or ()
            for g in set(now):
                if wanted is None or g in wanted:
                    usage[g] = usage.get(g, 0) + milli

        usage: dict[str, int] = {}
        with self.store.session() as s:  # the columns only, not every row as an object
            rows = s.execute(
                select(Allocation.owner, Allocation.groups, Allocation.gpus, Allocation.gpu_milli).filter_by(
                    kind=WorkloadKind.BUILD
                )
            ).all()
        for owner, groups, gpus, gpu_milli in rows:
            add(owner, groups, len(gpus) * gpu_milli)
        for p in self.parked_without_gpu():  # a parked share still counts against quotas
            add(p.owner, p.groups, p.total_milli)
        return usage

    def build_holders(self) -> set[str]:
        """Every user holding a build share (or a parked one)."""
        return {r.owner for r in self.store.allocations(kind=WorkloadKind.BUILD)} | {
            p.owner for p in self.parked_shares()
        }

    def parked_shares(self) -> list[ParkedShare]:
        """Workspaces that gave their GPU back and keep a claim to resume (gpupool.pool.parking).
        Read through Core (every reservation reads it: the ORM's session was most of the cost)."""
        with self.store.engine.connect() as conn:
            rows = conn.execute(_PARKED_ROWS).all()
        return [
            ParkedShare(
                r.owner,
                r.name,
                r.node,
                tuple(r.gpus),
                r.gpu_milli,
                r.model,
                tuple(r.groups or ()),
                r.parked_at,
                r.claimed_at,
                tuple(r.pids or ()),
            )
            for r in rows
        ]

    def parked_without_gpu(self) -> list[ParkedShare]:
        """Parked shares that hold no GPU now (a resuming one holds its allocation again)."""
        parked = self.parked_shares()
        if not parked:  # the common case: no table scan of every workspace per spawn
            return []
        with self.store.session() as s:
            placed = set(
                s.execute(select(Allocation.owner, Allocation.name).filter_by(kind=WorkloadKind.BUILD)).all()
            )
        return [p for p in parked if p.key not in placed]

    def forget_parked(self, w: Workload) -> bool:
        with self.store.session() as s:
            row = s.scalar(select(Parked).filter_by(owner=w.owner, name=w.name))
            if row is not None:
                s.delete(row)
                # the parked interval, whole, for usage accounting (gpupool.usage.ledger)
                s.add(
                    Event(
                        kind=EventKind.UNPARK,
                        message=f"{w.label} no longer parked",
                        owner=w.owner,
                        name=w.name,
                        data={
                            "since": row.parked_at,
                            "milli": len(row.gpus) * row.gpu_milli,
                            "groups": list(row.groups or []),
                        },
                    )
                )
        return row is not None

    # --- changes -------------------------------------------------------------
    def build_pools(self, groups: Iterable[str], chosen: str | None = None) -> tuple[str, ...]:
        """The node pools a workspace of a user in `groups` goes to, in order of preference
        (empty: any GPU); `chosen` narrows them to one, or raises PoolNotAllowed."""
        return allowed_pools(self.quotas.limits_for(groups).pools, list(self.node_pools), chosen)

    def reserve_build(
        self,
        owner: str,
        groups: Iterable[str],
        server_name: str,
        milli: int,
        cpu_milli: int = 0,
        memory_mib: int = 0,
        pool: str | None = None,
        in_pools: bool = True,
        groups_of: Mapping[str, Iterable[str]] | None = None,
    ) -> Allocation:
        """Check the fixed quota, place (within the groups' node pools, or `pool` of them;
        `in_pools` False: the pools are only checked, as on Kubernetes where the pod's node
        affinity keeps it there), persist. Raises a PoolError that says what to do.
        Thread-safe (the manager's lock): `reserve_build_async` runs it off the event loop."""
        with self.lock:
            if self.stopping:
                raise HubStopping(self.stopping)
            if why := self.disk_refusal():
                raise DiskReserve(why)
            return self._reserve_build(
                owner, groups, server_name, milli, cpu_milli, memory_mib, pool, in_pools, groups_of
            )

    async def reserve_build_async(self, *args: Any, **kwargs: Any) -> Allocation:
        """`reserve_build` in a worker thread, so the hub's event loop goes on serving other
        users while it reads, places and commits (fsync). Only for hubs where nothing changes
        the pool's state without the manager's lock (Kubernetes: KAI places train jobs)."""
        return await asyncio.to_thread(self.reserve_build, *args, **kwargs)

    def _reserve_build(
        self,
        owner: str,
        groups: Iterable[str],
        server_name: str,
        milli: int,
        cpu_milli: int,
        memory_mib: int,
        pool: str | None,
        in_pools: bool,
        groups_of: Mapping[str, Iterable[str]] | None,
    ) -> Allocation:
        w = Workload(WorkloadKind.BUILD, owner, server_name)
        with self.store.engine.connect() as conn:  # one read (Core): this server's row and the rest
            mine = conn.execute(_BUILD_ROWS, {"owner": owner}).all()
        existing = next((r for r in mine if r.name == server_name), None)
        if existing is not None:
            # a retried start of the same server keeps its share instead of taking a second one
            if len(existing.gpus) * existing.gpu_milli == milli:
                return Allocation(**existing._asdict())  # as a session would return it, detached
            self.release(w, reason="replaced by a new start with another size")
        groups = sorted(set(groups))
        pools = self.build_pools(groups, pool)  # a pool not theirs is refused wherever it is placed
        if not in_pools:
            pools = ()
        held = [Holding(r.name, len(r.gpus) * r.gpu_milli) for r in mine if r.name != server_name]
        parked = self.parked_without_gpu()  # read once: the quota and the placement see the same claims
        held += [h for h in quota_holdings(parked, owner) if h.server_name != server_name]  # as holdings()
        self.quotas.check(milli, groups, held, self.group_usage(groups_of, only=groups))
        self.hooks.admit(w, groups, milli)  # a GPU-hour budget used up (gpupool.usage): refused
        req = Request.for_gpus(milli, cpu_milli=cpu_milli, memory_mib=memory_mib)
        try:
            row = self.reserve(w, req, groups, pools, parked)
        except NoCapacity:
            # one pool: build workspaces come first; train jobs borrowing GPUs make room
            # the spawn page says which jobs stop for it and about how long that takes
            if making := self.hooks.make_room_for_build(w, req, pools=pools):
                raise RoomBeingFreed(f"Making room for {format_gpus(req.total_milli)}: {making}") from None
            # then idle notebooks may move out of its way (make-before-break, gpupool.parking.mover)
            moving = self.hooks.make_room_by_moving(w, req, groups, pools)
            if moving:
                raise RoomBeingFreed(moving) from None
            raise
        self.hooks.build_reserved(w)
        return row

    def reserve(
        self,
        w: Workload,
        req: Request,
        groups: Iterable[str] = (),
        pools: tuple[str, ...] = (),
        parked: list[ParkedShare] | None = None,
    ) -> Allocation:
        """Place and persist; `parked`: the parked shares without a GPU, where the caller has
        just read them."""
        with self.lock:
            return self._reserve(w, req, groups, pools, parked)

    def _reserve(
        self,
        w: Workload,
        req: Request,
        groups: Iterable[str],
        pools: tuple[str, ...],
        parked: list[ParkedShare] | None,
    ) -> Allocation:
        # resume claims of parked workspaces come before newcomers (gpupool.pool.parking)
        placement = choose_in_pools(
            self.policy,
            self.newcomer_view(parked),
            req,
            self.rng,
            [self.node_pools.get(p, NodePool(p, gpus=frozenset({-1}))) for p in pools],
        )
        if placement is None:
            free = self._free_summary() + (f" (your node pools: {', '.join(pools)})" if pools else "")
            raise NoCapacity(
                f"no GPU has room for {format_gpus(req.total_milli)} right now ({free}):"
                " choose a smaller fraction or try again when others stop"
            )
        row = self.reserve_at(w, placement, groups)
        self.policy.learn(req)  # a real placement: the only thing the policy learns from
        return row

    def reserve_at(self, w: Workload, placement: Placement, groups: Iterable[str] = ()) -> Allocation:
        """Hold exactly this placement (the training scheduler chose it); persisted at once,
        the allocation and its event in one transaction."""
        with self.lock:
            return self._reserve_at(w, placement, groups)

    def _reserve_at(self, w: Workload, placement: Placement, groups: Iterable[str]) -> Allocation:
        self.state.apply(placement)
        now = utcnow()
        values: dict[str, object] = {
            "kind": w.kind,
            "owner": w.owner,
            "name": w.name,
            "node": placement.node,
            "gpus": list(placement.gpus),
            "gpu_milli": placement.gpu_milli,
            "cpu_milli": placement.cpu_milli,
            "memory_mib": placement.memory_mib,
            "groups": sorted(groups),
            "state": AllocationState.RESERVED,
            "pid": None,
            "created": now,
            "updated": now,
        }
        event = {
            "time": now,
            "kind": EventKind.ALLOCATE,
            "message": f"{w.label} holds {format_gpus(placement.total_milli)}"
            f" on {placement.node} GPU {list(placement.gpus)}",
            "owner": w.owner,
            "name": w.name,
            "data": {
                "milli": placement.total_milli,
                "kind": w.kind,
                "node": placement.node,
                "gpus": list(placement.gpus),
                "groups": values["groups"],
            },
        }
        try:
            # Core inserts in one transaction, not the ORM's unit of work: a spawn pays this
            # commit, and the ORM's flush was most of the reservation's CPU (benchmarks.kube)
            with self.store.engine.begin() as conn:
                (row_id,) = conn.execute(_INSERT_ALLOCATION, values).inserted_primary_key or (None,)
                conn.execute(_INSERT_EVENT, event)
        except Exception:
            self.state.release(placement)
            raise
        row = Allocation(id=row_id, **values)  # as a session would return it, detached
        log.info(
            "allocated %s to %s on %s GPUs %s",
            format_gpus(placement.total_milli),
            w.label,
            placement.node,
            list(placement.gpus),
        )
        self.placement_changed(w)
        return row

    def placement_changed(self, w: Workload) -> None:
        if w.kind == WorkloadKind.BUILD:
            self.hooks.build_changed(w.owner, w.name)

    def mark_running(self, w: Workload, pid: int | None) -> None:
        """The workload's server runs (with `pid` where the hub can see it); nothing if its
        share was released meanwhile. One UPDATE: a spawn pays it on the hub's event loop."""
        with self.store.engine.begin() as conn:  # Core, not the ORM's bulk update: a third of the CPU
            conn.execute(
                _MARK_RUNNING, {"w_kind": w.kind, "w_owner": w.owner, "w_name": w.name, "w_pid": pid}
            )

    def newcomer_view(self, parked: list[ParkedShare] | None = None) -> ClusterState:
        """The pool as a new spawn or train job may see it: room kept for resume claims."""
        if parked is None:
            parked = self.parked_without_gpu()
        return newcomer_view(self.state, parked, self.policy, self.rng)

    def release(self, w: Workload, reason: str, keep_parked: bool = False) -> bool:
        """Give a workload's share back. Idempotent: releasing twice is harmless. A stopped
        workspace also drops its parked share; parking itself keeps it (`keep_parked`)."""
        with self.lock:
            if w.kind == WorkloadKind.BUILD and not keep_parked and self.forget_parked(w):
                self.store.record(
                    EventKind.RELEASE, f"{w.label} parked share dropped: {reason}", owner=w.owner, name=w.name
                )
            with self.store.session() as s:
                placement = self.release_in(s, w, reason)
            if placement is not None:
                self.state.release(placement)
        self.placement_changed(w)  # outside the lock: it writes the workspace's GPU file
        if placement is None:  # at most a parked share dropped
            return False
        log.info("released %s (%s)", w.label, reason)
        return True

    def release_in(self, s: Session, w: Workload, reason: str) -> Placement | None:
        """The database half of a release, inside the caller's transaction (so that, e.g., a
        job's end and the return of its GPUs commit together). The caller gives the returned
        placement to `state.release` once that transaction has committed."""
        row = s.scalar(select(Allocation).filter_by(kind=w.kind, owner=w.owner, name=w.name))
        if row is None:
            return None
        placement = _placement(row)
        self._delete_in(s, row, reason)
        return placement

    def _delete(self, row_id: int, reason: str) -> None:
        with self.store.session() as s:
            row = s.get(Allocation, row_id)
            if row is not None:
                self._delete_in(s, row, reason)

    def _delete_in(self, s: Session, row: Allocation, reason: str) -> None:
        milli = row.total_milli
        # held in a restored backup and never seen running since: it ended after the backup, at a
        # time nobody knows; charged up to the backup's time only
        key = (row.kind, row.owner, row.name)
        until = self.backup_made if key in self.unseen else None
        self.unseen.discard(key)
        s.delete(row)
        # the release carries the whole interval it closes, so usage accounting needs no other
        # record of it (gpupool.usage.ledger)
        since = row.created.replace(tzinfo=dt.UTC).timestamp() if row.created else None
        s.add(
            Event(
                kind=EventKind.RELEASE,
                message=f"{_label(row)} released {format_gpus(milli)}: {reason}",
                owner=row.owner,
                name=row.name,
                data={
                    "milli": milli,
                    "kind": row.kind,
                    "node": row.node,
                    "gpus": list(row.gpus),
                    "groups": list(row.groups or []),
                    "since": since,
                    **({"until": until} if until is not None else {}),
                },
            )
        )

    def reconcile(
        self, is_running: Callable[[Allocation], bool], kind: WorkloadKind = WorkloadKind.BUILD
    ) -> list[str]:
        """Release allocations whose workload is not really running (after a crash)."""
        released = []
        for row in self.store.allocations(kind=kind):
            if not is_running(row):
                self.release(Workload.of(row), reason="not running (reconciled)")
                released.append(_label(row))
            else:
                self.seen_running(Workload.of(row))
        if kind == WorkloadKind.BUILD:
            for p in self.parked_shares():
                w = Workload(WorkloadKind.BUILD, p.owner, p.name)
                if self.allocation(w) is None and not is_running(
                    Allocation(kind=WorkloadKind.BUILD, owner=p.owner, name=p.name)
                ):
                    self.release(w, reason="not running (reconciled)")
                    released.append(f"{w.label} (parked)")
        return released

    def _free_summary(self) -> str:
        parts = []
        for n, node in enumerate(self.inventory.nodes):
            for gpu, f in zip(node.gpus, self.state.node_gpu_free(n), strict=True):
                parts.append(f"GPU {gpu.index}: {format_gpus(f)} free")
        return "; ".join(parts) if parts else "the pool has no GPUs"


def _placement(row: Allocation) -> Placement:
    return Placement(
        node=row.node,
        gpus=tuple(row.gpus),
        gpu_milli=row.gpu_milli,
        cpu_milli=row.cpu_milli,
        memory_mib=row.memory_mib,
    )


def _label(row: Allocation) -> str:
    return Workload.of(row).label
