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
from gpupool.contain.limits import JOB_PREFIX

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


def unknown_work(tree: Tree, mine: str, known: set[str]) -> dict[str, list[int]]:
    """Populated workload cgroups of this instance (`job-<id>`, `ws-<digest>`) that the databases do
    not know as running: work started after the backup they were restored from."""
    out = {}
    for w in tree.names(mine):
        if w not in known:
            pids = tree.pids(f"{mine}/{w}")
            if pids:
                out[w] = pids
    return out


def whose(pid: int, proc_root: str = "/proc") -> str:
    """The hub user a workload process runs for (its JUPYTERHUB_USER), for the message; "" if unknown."""
    try:
        for var in (Path(proc_root) / str(pid) / "environ").read_bytes().split(b"\0"):
            if var.startswith(b"JUPYTERHUB_USER="):
                return var[16:80].decode(errors="replace")
    except OSError:
        pass
    return ""


def refuse_unknown(tree: Tree, mine: str, known: set[str], where: str, state_hint: str = "") -> None:
    unknown = unknown_work(tree, mine, known)
    if not unknown:
        return
    items = []
    for w, pids in sorted(unknown.items())[:10]:
        what = f"train job {w[len(JOB_PREFIX) :]}" if w.startswith(JOB_PREFIX) else "a workspace"
        user = whose(pids[0])
        items.append(
            f"{what}{' of ' + user if user else ''} (cgroup {tree.path(f'{mine}/{w}')}, pids"
            f" {', '.join(map(str, sorted(pids)[:5]))})"
        )
    raise LostState(
        f"gpupool will not start: {len(unknown)} workload(s) of this hub run that its database {where}"
        f" does not know: {'; '.join(items)}. The database is older than they are (a restore of an"
        " earlier backup?): starting would show their GPUs free and hand them out again. End them"
        f" (kill the cgroup's processes, e.g. `kill -9 $(cat CGROUP/cgroup.procs)`), or put back a"
        f" newer backup (`gpupool restore{' --state ' + state_hint if state_hint else ''} BACKUP`),"
        " and start again."
    )


def settle(
    store, tree: Tree, hub_key: str, where: str, state_hint: str = "", known: set[str] | None = None
) -> str:
    """This database's instance id (made now for a new one); LostState when work of another
    instance of this hub still runs, or (given `known`, the workload cgroup names the databases
    know as running) work of this instance they do not know. Empty cgroups left by earlier
    instances are removed."""
    mine = stored_id(store)
    if mine is not None and known is not None:
        refuse_unknown(tree, mine, known, where, state_hint)
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
