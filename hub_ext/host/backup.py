"""`gpupool backup` and `gpupool restore`: the embedded hub's state (its two SQLite databases).

A backup is taken with SQLite's online backup API, consistent even while the hub runs. It goes into
a folder the backup makes itself (never one that exists: a user could have made it first, in a
world-writable place such as /tmp, and read the databases or plant links in it), under a private
umask, every file created without following links (O_CREAT|O_EXCL|O_NOFOLLOW).

A restore refuses while a hub uses the state folder, and refuses a backup folder or file that is not
the caller's (root's, as root) or that others may write: such a backup could have been changed.
Each file is read through the descriptor it was checked on, copied and checked in the state folder,
and the files it replaces are moved aside (`<name>.before-restore-<time>`), never deleted.

The backup's copy of the pool database carries the time it was made (setting `backup`): the first
start after a restore closes the shares of workloads that no longer run at that time, not at the
restart's, so nobody is charged for the time between the backup and the restart (gpupool.alloc.manager).
"""

from __future__ import annotations

import contextlib
import json
import os
import sqlite3
import stat
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

FILES = ("gpupool.sqlite", "jupyterhub.sqlite")  # the pool's allocations, jobs, instance id; the hub's users
MANIFEST = "gpupool-backup.json"
MADE_SETTING = "backup"  # in the backup's copy of gpupool.sqlite: {"made": epoch seconds}
NEW_FILE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
READ_FILE = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


class BackupError(Exception):
    """A backup or restore that cannot be done; the message says why."""


@contextlib.contextmanager
def private_umask() -> Iterator[None]:
    old = os.umask(0o077)
    try:
        yield
    finally:
        os.umask(old)


def backup(state: Path, out: Path, clock=time.time) -> dict[str, Any]:
    """Copy the state's databases into the new folder `out` (made now, 0700); returns the manifest."""
    missing = [f for f in FILES if not (state / f).is_file()]
    if missing:
        raise BackupError(f"{state} has no {', '.join(missing)}: is it the state folder of a gpupool hub?")
    with private_umask():
        out.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        try:
            os.mkdir(out, 0o700)  # never an existing folder: whoever made it could read or redirect the copy
        except FileExistsError:
            raise BackupError(f"{out} exists: give a new folder, `gpupool backup` makes it") from None
        dfd = os.open(out, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        try:
            st = os.fstat(dfd)
            if st.st_uid != os.geteuid() or stat.S_IMODE(st.st_mode) != 0o700:
                raise BackupError(f"{out} was replaced while the backup made it: nothing was written")
            made = clock()
            for name in FILES:
                os.close(os.open(name, NEW_FILE, 0o600, dir_fd=dfd))  # ours, empty: SQLite fills it
                src = sqlite3.connect(f"file:{state / name}?mode=ro", uri=True)
                dst = sqlite3.connect(f"/proc/self/fd/{dfd}/{name}")  # through the folder checked above
                try:
                    src.backup(dst)  # a consistent copy, while the hub writes
                    dst.execute("PRAGMA journal_mode=DELETE")  # one self-contained file, no -wal beside it
                    if name == FILES[0]:
                        dst.execute(
                            "INSERT OR REPLACE INTO gpupool_settings (key, value, updated)"
                            " VALUES (?, ?, CURRENT_TIMESTAMP)",
                            (MADE_SETTING, json.dumps({"made": made})),
                        )
                        dst.commit()
                finally:
                    src.close()
                    dst.close()
            manifest = {
                "made": time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(made)),
                "state": str(state),
                "files": list(FILES),
                "instance": instance_of(out / FILES[0]),
            }
            fd = os.open(MANIFEST, NEW_FILE, 0o600, dir_fd=dfd)
            with os.fdopen(fd, "w") as f:
                f.write(json.dumps(manifest, indent=1) + "\n")
        finally:
            os.close(dfd)
    return manifest


def trusted(st: os.stat_result, what: str) -> None:
    """Refuse what another account owns, or what group or others may write (and so may have changed)."""
    if st.st_uid != os.geteuid():
        raise BackupError(f"{what} belongs to uid {st.st_uid}, not to you (uid {os.geteuid()}): refused")
    if st.st_mode & 0o022:
        raise BackupError(f"{what} may be written by others (mode {stat.S_IMODE(st.st_mode):o}): refused")


def restore(backup_dir: Path, state: Path, proc_root: str = "/proc") -> list[str]:
    """Put a backup's databases in place of the state's; the replaced files are kept aside. Refused
    while a hub runs on `state`. Returns what was done, one line each."""
    users = hub_processes(state, proc_root)
    if users:
        raise BackupError(f"a hub runs on {state} (pids {', '.join(map(str, users[:10]))}): stop it first")
    try:
        dfd = os.open(backup_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as err:
        raise BackupError(
            f"{backup_dir} cannot be opened as a folder (links are not followed): {err}"
        ) from None
    stamp = time.strftime("%Y%m%d-%H%M%S")
    copies: list[Path] = []
    try:
        trusted(os.fstat(dfd), str(backup_dir))
        with private_umask():
            state.mkdir(parents=True, exist_ok=True)
            for name in FILES:
                copies.append(copy_checked(dfd, backup_dir, name, state / f"{name}.restoring-{stamp}"))
        for name, copy in zip(FILES, copies, strict=True):
            check_database(copy, shown=backup_dir / name)
        if instance_of(copies[0]) is None:
            raise BackupError(f"{backup_dir / FILES[0]} has no instance id: not a gpupool backup")
        done = []
        for name, copy in zip(FILES, copies, strict=True):
            for suffix in ("", "-wal", "-shm"):
                old = state / (name + suffix)
                if old.exists() or old.is_symlink():
                    aside = state / f"{name}{suffix}.before-restore-{stamp}"
                    os.replace(old, aside)
                    done.append(f"moved {old} aside to {aside.name}")
            os.replace(copy, state / name)
            done.append(f"restored {state / name}")
        return done
    finally:
        os.close(dfd)
        for name in FILES:  # a copy refused, or what checking a WAL-mode copy left beside it
            for left in state.glob(f"{name}.restoring-{stamp}*"):
                left.unlink(missing_ok=True)


def copy_checked(dfd: int, backup_dir: Path, name: str, to: Path) -> Path:
    """`name` of the backup folder, opened without following links and checked on its descriptor,
    copied to `to` (a new file)."""
    try:
        src = os.open(name, READ_FILE, dir_fd=dfd)
    except FileNotFoundError:
        raise BackupError(f"{backup_dir} has no {name}: is it a folder `gpupool backup` made?") from None
    except OSError as err:  # ELOOP: a symbolic link
        raise BackupError(f"{backup_dir / name} cannot be opened (links are not followed): {err}") from None
    try:
        st = os.fstat(src)
        if not stat.S_ISREG(st.st_mode):
            raise BackupError(f"{backup_dir / name} is not a regular file: refused")
        trusted(st, str(backup_dir / name))
        os.set_blocking(src, True)
        dst = os.open(to, NEW_FILE, 0o600)
        with os.fdopen(dst, "wb") as out:
            while chunk := os.read(src, 1 << 20):
                out.write(chunk)
    finally:
        os.close(src)
    return to


def check_database(path: Path, shown: Path | None = None) -> None:
    try:
        con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
        try:
            (result,) = con.execute("PRAGMA integrity_check").fetchone()
        finally:
            con.close()
    except sqlite3.DatabaseError as err:
        raise BackupError(f"{shown or path} is not a readable database: {err}") from None
    if result != "ok":
        raise BackupError(f"{shown or path} is damaged: {result}")


def instance_of(path: Path) -> str | None:
    try:
        con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
        try:
            row = con.execute("SELECT value FROM gpupool_settings WHERE key = 'instance'").fetchone()
        finally:
            con.close()
    except sqlite3.DatabaseError:
        return None
    value = json.loads(row[0]) if row else {}
    return value.get("id") if isinstance(value, dict) else None


def hub_processes(state: Path, proc_root: str = "/proc") -> list[int]:
    """JupyterHub processes of this state folder (started with GPUPOOL_STATE_DIR=<state>); the proxy
    and the servers a crashed hub left running do not count."""
    marker = f"GPUPOOL_STATE_DIR={state}".encode()
    found = []
    for proc in Path(proc_root).iterdir():
        if proc.name.isdigit() and int(proc.name) != os.getpid():
            try:
                args = (proc / "cmdline").read_bytes().split(b"\0")
                if any(a == b"jupyterhub" or a.endswith(b"/jupyterhub") for a in args) and marker in (
                    proc / "environ"
                ).read_bytes().split(b"\0"):
                    found.append(int(proc.name))
            except OSError:
                continue
    return sorted(found)
