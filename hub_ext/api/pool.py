"""Read-only views of the pool: GPUs and who holds which share, my quota, events."""

from __future__ import annotations

import time

from tornado import web

from gpupool.alloc.manager import PoolManager
from gpupool.api.auth import APIHandler, Caller
from gpupool.pool import format_gpus
from gpupool.store.moves import last_moves
from gpupool.vocab.kinds import WorkloadKind
from gpupool.vocab.pool_wire import GPUView, MeView, Moved, PoolView, ShareView

OTHER = "(another user)"


def gpu_table(pool: PoolManager, caller: Caller) -> list[GPUView]:
    """Every GPU with its shares; users see their own names, admins see everyone's."""
    shares: dict[tuple[str, int], list[ShareView]] = {}
    with pool.store.session() as s:  # a workspace moved in the last day says so (gpupool.parking.mover)
        moved = last_moves(s, time.time() - 86400)
    for row in pool.store.allocations():
        seen = row.owner == caller.name or caller.sees_all
        m = moved.get((row.owner, row.name)) if seen and row.kind == WorkloadKind.BUILD else None
        last: Moved | None = (
            {
                "at": m.ended_at,
                "from_node": m.from_node,
                "from_gpus": m.from_gpus,
                "to_node": m.to_node,
                "to_gpus": m.to_gpus,
                "why": m.why,
            }
            if m is not None and m.to_node == row.node and list(m.to_gpus) == list(row.gpus)
            else None
        )
        for g in row.gpus:
            share: ShareView = {
                "kind": row.kind,
                "owner": row.owner if seen else OTHER,
                "name": row.name if seen else "",
                "milli": row.gpu_milli,
                "state": row.state,
            }
            if caller.sees_all:
                share["pid"] = row.pid
            if last is not None:
                share["moved"] = last
            shares.setdefault((row.node, g), []).append(share)
    out: list[GPUView] = []
    for n, node in enumerate(pool.inventory.nodes):
        for gpu in node.gpus:
            out.append(
                {
                    "node": node.name,
                    "index": gpu.index,
                    "uuid": gpu.uuid,
                    "model": gpu.model,
                    "memory_mib": gpu.memory_mib,
                    "virtual": gpu.virtual,
                    "free_milli": int(pool.state.gpu_free[n][gpu.index]),
                    "shares": shares.get((node.name, gpu.index), []),
                }
            )
    return out


class PoolHandler(APIHandler):
    @web.authenticated
    def get(self) -> None:
        answer: PoolView = {"gpus": gpu_table(self.pool, self.caller)}
        self.write_json(answer)


class MeHandler(APIHandler):
    @web.authenticated
    def get(self) -> None:
        caller = self.caller
        pool: PoolManager = self.pool
        held = pool.holdings(caller.name)
        limits = pool.quotas.limits_for(caller.groups)
        answer: MeView = {
            "name": caller.name,
            "admin": caller.admin,
            "groups": list(caller.groups),
            "build_quota_milli": limits.quota_milli,
            "build_quota": format_gpus(limits.quota_milli),
            "sizes_milli": list(limits.sizes_milli),
            "max_per_workspace_milli": limits.max_per_workspace_milli,
            "max_workspaces": limits.max_workspaces,
            # parked shares too (`parked`: true): they count against the quota as the spawn checks it
            # memory_killed: what the kernel's OOM killer did in the workspace's cgroup ("killed:
            # over its 8 GiB memory limit"; ""), which JupyterLab's status says (a kernel that
            # died of it restarts with no other word)
            "holdings": [
                {
                    "server": h.server_name,
                    "milli": h.milli,
                    "parked": h.parked,
                    "memory_killed": self.memory_note(caller.name, h.server_name),
                }
                for h in held
            ],
            "offered": [{"milli": m, "fits": f} for m, f in pool.quotas.offered_sizes(caller.groups, held)],
        }
        self.write_json(answer)

    def memory_note(self, owner: str, server: str) -> str:
        cgroups = self.root.cgroups
        return cgroups.tree.memory_note(cgroups.workspace(owner, server)) if cgroups.available else ""


class EventsHandler(APIHandler):
    @web.authenticated
    def get(self) -> None:
        caller = self.caller
        try:
            limit = int(self.get_argument("limit", "100"))
        except ValueError:
            raise web.HTTPError(400, "limit must be a whole number") from None
        if not 1 <= limit <= 1000:
            raise web.HTTPError(400, "limit must be between 1 and 1000")
        filters = {} if caller.admin else {"owner": caller.name}
        if kind := self.get_argument("kind", ""):
            filters["kind"] = kind
        events = self.pool.store.events(limit=limit, **filters)
        self.write_json(
            {
                "events": [
                    {
                        "time": e.time.isoformat() + "Z",
                        "kind": e.kind,
                        "owner": e.owner,
                        "name": e.name,
                        "message": e.message,
                        "data": e.data,
                    }
                    for e in events
                ]
            }
        )
