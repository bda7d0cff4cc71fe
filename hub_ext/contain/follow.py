"""A workspace's device rules follow its GPU share: moves, parking and resume.

Which GPUs a workspace may open is read from the same rows that say where its share is: its build
allocation and, while a move is under way, the move's destination. A move therefore allows the
destination when it is reserved (before the kernel is restored there) and denies the source only
once the move has ended (make-before-break); a parked share holds no GPU, so its kernel may open
none until its resume is granted one. A hub killed between the two steps finishes the move at its
next start (gpupool.parking.mover.recover) and `follow_all` then sets every workspace's rules from the rows.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from sqlalchemy import select

from gpupool.contain import WorkloadCgroups
from gpupool.store import Allocation
from gpupool.vocab.kinds import WorkloadKind

if TYPE_CHECKING:  # the manager calls this module: a type, never an import upward
    from gpupool.alloc.manager import PoolManager

log = logging.getLogger("gpupool.contain")
KINDS = (WorkloadKind.BUILD, WorkloadKind.MOVE)


class WorkspaceDevices:
    def __init__(self, pool: PoolManager, cgroups: WorkloadCgroups) -> None:
        self.pool, self.cgroups = pool, cgroups

    def minors(self, owner: str, name: str) -> list[int]:
        """The device minors of every GPU the workspace holds now (a move: both ends)."""
        with self.pool.store.session() as s:
            rows = list(
                s.scalars(
                    select(Allocation).where(
                        Allocation.owner == owner, Allocation.name == name, Allocation.kind.in_(KINDS)
                    )
                )
            )
            placed = [(r.node, list(r.gpus)) for r in rows]
        out: set[int] = set()
        for node_name, gpus in placed:
            node = self.pool.inventory.node(node_name)
            out.update(node.gpus[g].device_minor for g in gpus)
        return sorted(out)

    def follow(self, owner: str, name: str) -> None:
        """Set the workspace's device rules from the rows. Never raises: logged (a move must not
        fail on it; the kernel keeps what it had)."""
        if not self.cgroups.available:
            return
        try:
            self.cgroups.tree.set_gpus(self.cgroups.workspace(owner, name), self.minors(owner, name))
        except Exception as err:  # noqa: BLE001
            log.error("could not set the GPU devices of %s/%s: %s", owner, name, err)

    def follow_all(self) -> None:
        """Every workspace with a cgroup of this instance, from the rows (after a restart)."""
        if not self.cgroups.available:
            return
        with self.pool.store.session() as s:
            keys = {
                (r.owner, r.name) for r in s.scalars(select(Allocation).where(Allocation.kind.in_(KINDS)))
            }
        held = {self.cgroups.workspace(o, n): (o, n) for o, n in keys}
        instance = self.cgroups.instance
        for folder in self.cgroups.tree.names(instance):
            name = f"{instance}/{folder}"
            if not folder.startswith("ws-"):
                continue
            if name in held:
                self.follow(*held[name])
            else:  # no share (parked, or stopping): no GPU
                self.cgroups.tree.set_gpus(name, ())
