"""Never start on lost state: the database knows which instance it is, and so does running work.

A new database gets an instance id (stored in it). Every workspace and train job of the hub carries
it: in its cgroup's path (`gpupool-<hub key>/<instance>/...`) and in its environment
(GPUPOOL_HUB / GPUPOOL_INSTANCE). At start the hub compares the two: when work of an instance runs
that is not its database's — the database was moved aside, emptied or swapped for another one while
servers or jobs ran — it refuses to start with the reason and what to do, instead of showing their
GPUs free and handing them to someone else.
"""

from __future__ import annotations

import secrets
from pathlib import Path

from gpupool.contain.cgroups import SEGMENT, Tree

SETTING = "instance"
HUB_VAR, INSTANCE_VAR = "GPUPOOL_HUB", "GPUPOOL_INSTANCE"


class LostState(Exception):
    """The hub must not start: the message says why and what to do."""


def stored_id(store) -> str | None:
    value = (store.get_setting(SETTING) or {}).get("id")
    return value if isinstance(value, str) and SEGMENT.match(value) else None


def running(tree: Tree, hub_key: str, proc_root: str = "/proc") -> dict[str, list[int]]:
    """instance id -> pids of this hub's workspaces and jobs that still run: from the cgroups, and
    from the environment of processes (where there are no cgroups)."""
    out: dict[str, list[int]] = {}
    for inst in tree.names():
        pids = [p for w in tree.names(inst) for p in tree.pids(f"{inst}/{w}")]
        if pids:
            out[inst] = pids
    hub = f"{HUB_VAR}={hub_key}".encode()
    prefix = f"{INSTANCE_VAR}=".encode()
    for proc in Path(proc_root).iterdir():
        if not proc.name.isdigit():
            continue
        try:
            environ = (proc / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if hub not in environ:
            continue
        inst = next((v[len(prefix) :].decode(errors="replace") for v in environ if v.startswith(prefix)), "")
        if SEGMENT.match(inst) and int(proc.name) not in out.get(inst, []):
            out.setdefault(inst, []).append(int(proc.name))
    return out


def settle(store, tree: Tree, hub_key: str, where: str, state_hint: str = "") -> str:
    """This database's instance id (made now for a new one); LostState when work of another
    instance of this hub still runs. Empty cgroups left by earlier instances are removed."""
    mine = stored_id(store)
    others = {i: p for i, p in running(tree, hub_key).items() if i != mine}
    if others:
        inst, pids = next(iter(others.items()))
        what = "has no instance id (it is new or empty)" if mine is None else f"belongs to instance {mine}"
        shown = ", ".join(str(p) for p in sorted(pids)[:10]) + (" ..." if len(pids) > 10 else "")
        group = f" (cgroup {tree.path(inst)})" if tree.available and inst in tree.names() else ""
        raise LostState(
            f"gpupool will not start: its database {where} {what}, but {len(pids)} process(es) of this hub's"
            f" instance {inst} still run{group}: pids {shown}. Starting would show their GPUs free and hand them"
            " to others. Put back the database they belong to (`gpupool restore"
            f"{' --state ' + state_hint if state_hint else ''} BACKUP`, or move the original file back with its -wal and"
            " -shm files), or end"
            " them first (stop the servers and jobs, or kill those pids) and start again."
        )
    if mine is None:
        mine = secrets.token_hex(6)
        store.put_setting(SETTING, {"id": mine})
    for inst in tree.names():
        if inst != mine:
            tree.remove(inst)  # empty: checked above
    return mine
