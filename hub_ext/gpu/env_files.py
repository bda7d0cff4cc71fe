"""Where a workspace's GPU is NOW, for the processes it starts later.

A server's environment is fixed when it starts, but its share may move (gpupool.parking.mover) or
come back on another GPU after parking: a kernel started afterwards must not inherit the old
CUDA_VISIBLE_DEVICES (that GPU is someone else's now). The hub, the one owner of allocation
state, writes the current GPU variables of each workspace to a small JSON file in a folder of
its own; the workspace's start-up code (gpu/startup/gpupool_gpuenv.py) reads it in every Python
process, before a kernel or terminal is launched, and before each cell.

The folder and files are the hub's: users may read their own workspace's file (group = their
account's) and write none. The hub only writes here, never follows a path a user chose.
What a file says is derived from the database alone (`publish`), so a hub restart rewrites
every file from the rows (`publish_all`) and a crash between a commit and a write heals.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import stat
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from sqlalchemy import select

from gpupool.gpu.env import gpu_env
from gpupool.gpu.memory_cap import DEFAULT_CONTEXT_MIB
from gpupool.store import Allocation, Parked
from gpupool.vocab.kinds import WorkloadKind

if TYPE_CHECKING:
    from traitlets.config import Config

    from gpupool.alloc.manager import PoolManager

log = logging.getLogger("gpupool")
VAR = "GPUPOOL_GPU_ENV_FILE"  # tells the workspace's processes where their file is
FOLDER = "gpu-env"
NOT_PUBLISHED = ("PYTHONPATH",)  # fixed for the server's life; the rest follows the share


def file_name(owner: str, name: str) -> str:
    """A fixed-length name whatever the user and server names hold."""
    return hashlib.sha256(f"{owner}\0{name}".encode()).hexdigest()[:40] + ".json"


class GPUEnvFiles:
    """Writes `<folder>/<file_name>` for each workspace from the pool's rows."""

    def __init__(
        self,
        folder: str | os.PathLike[str],
        pool: PoolManager,
        mps_pipe_directory: str = "",
        gid_of: Callable[[str], int | None] = lambda owner: None,
        context_mib: int = DEFAULT_CONTEXT_MIB,
    ) -> None:
        self.folder, self.pool, self.mps = Path(folder), pool, mps_pipe_directory
        self.context_mib = context_mib  # per CUDA context, off each share's memory cap
        self.gid_of = gid_of  # the group that may read an owner's files (their account's)
        self._ready = False

    def path(self, owner: str, name: str) -> Path:
        return self.folder / file_name(owner, name)

    def _make_folder(self) -> None:
        if self._ready:
            return
        self.folder.mkdir(mode=0o711, parents=True, exist_ok=True)
        st = os.lstat(self.folder)
        if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o022:
            raise PermissionError(f"{self.folder} is not a folder only this hub may write")
        os.chmod(self.folder, 0o711)  # users pass through to their file, cannot list the others
        self._ready = True

    def current(self, owner: str, name: str) -> dict[str, object] | None:
        """What the file says: the share's GPUs (a move's destination from the moment it is
        reserved: new processes start where the kernel is going), "parked" (no GPU: a process
        started now sees none until the kernel's GPU comes back), or None (no workspace)."""
        with self.pool.store.session() as s:
            rows = list(
                s.scalars(
                    select(Allocation).where(
                        Allocation.owner == owner,
                        Allocation.name == name,
                        Allocation.kind.in_((WorkloadKind.BUILD, WorkloadKind.MOVE)),
                    )
                )
            )
            parked = s.scalar(select(Parked).filter_by(owner=owner, name=name)) is not None
        row = next((r for r in rows if r.kind == WorkloadKind.MOVE), None) or next(
            (r for r in rows if r.kind == WorkloadKind.BUILD), None
        )
        doc: dict[str, object] = {"workspace": f"{owner}/{name}"}
        if row is not None:
            node = self.pool.inventory.node(row.node)
            env = gpu_env(
                [node.gpus[g] for g in row.gpus], row.gpu_milli, self.mps, context_mib=self.context_mib
            )
            doc.update(
                state="moving" if row.kind == WorkloadKind.MOVE else "running",
                node=row.node,
                gpus=list(row.gpus),
                env={k: v for k, v in env.items() if k not in NOT_PUBLISHED},
            )
            return doc
        if parked:
            doc.update(state="parked", env={"CUDA_VISIBLE_DEVICES": ""})
            return doc
        return None

    def publish(self, owner: str, name: str) -> None:
        """Write (or remove) one workspace's file from the rows as they are now. Never raises:
        a write that fails is logged, and the processes keep the environment they started with."""
        try:
            self._make_folder()
            doc = self.current(owner, name)
            path = self.path(owner, name)
            if doc is None:
                path.unlink(missing_ok=True)
                return
            self._write(path, json.dumps(doc, sort_keys=True).encode(), self.gid_of(owner))
        except Exception as err:  # noqa: BLE001 - a spawn or a move must not fail on this
            log.error("could not publish the GPU of %s/%s for its new processes: %s", owner, name, err)

    def _write(self, path: Path, data: bytes, gid: int | None) -> None:
        tmp = path.with_suffix(".tmp")
        tmp.unlink(missing_ok=True)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        try:
            if gid is not None and os.geteuid() == 0:
                os.fchown(fd, 0, gid)
            os.fchmod(fd, 0o640 if gid is not None else 0o644)
            left = memoryview(data)
            while left:  # a nearly full disk may take part of it: the file is whole or not there
                left = left[os.write(fd, left) :]
        except BaseException:
            os.close(fd)
            tmp.unlink(missing_ok=True)  # a full disk keeps no half file; the old one stays
            raise
        os.close(fd)
        os.replace(tmp, path)

    def publish_all(self) -> None:
        """Every workspace's file from the rows (after a restart), and no file for one that is gone."""
        with self.pool.store.session() as s:
            keys = {
                (r.owner, r.name)
                for r in s.scalars(
                    select(Allocation).where(Allocation.kind.in_((WorkloadKind.BUILD, WorkloadKind.MOVE)))
                )
            }
            keys |= {(p.owner, p.name) for p in s.scalars(select(Parked))}
        for owner, name in sorted(keys):
            self.publish(owner, name)
        try:
            known = {file_name(o, n) for o, n in keys}
            for p in self.folder.glob("*.json"):
                if p.name not in known:
                    p.unlink(missing_ok=True)
        except OSError as err:
            log.error("could not tidy %s: %s", self.folder, err)


def default_folder() -> Path:
    """In the hub's state folder, where parking keeps its own (gpupool.wiring.setup.state_dir's rule)."""
    return Path(os.environ.get("GPUPOOL_STATE_DIR", os.path.abspath("state"))) / FOLDER


def account_gid(config: Config) -> Callable[[str], int | None]:
    """The group of a hub user's Unix account (gpupool.host.accounts), when the hub runs as root."""

    def gid_of(owner: str) -> int | None:
        if os.geteuid() != 0:
            return None  # the servers run as the hub's own account
        from gpupool.host.accounts import SystemAccounts

        account = SystemAccounts(config=config).lookup(owner)
        return account.gid if account is not None else None

    return gid_of
