"""`gpupool backup` and `gpupool restore`: the embedded hub's state (its two SQLite databases).

A backup is taken with SQLite's online backup API, consistent even while the hub runs; a restore
refuses while a hub uses the state folder, checks each file before it is used, and moves the files
it replaces aside (`<name>.before-restore-<time>`), never deleting them.
"""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import time
from pathlib import Path

FILES = ("gpupool.sqlite", "jupyterhub.sqlite")  # the pool's allocations, jobs, instance id; the hub's users
MANIFEST = "gpupool-backup.json"


class BackupError(Exception):
    """A backup or restore that cannot be done; the message says why."""


def backup(state: Path, out: Path) -> dict:
    """Copy the state's databases into the new folder `out` (0700); returns the manifest."""
    missing = [f for f in FILES if not (state / f).is_file()]
    if missing:
        raise BackupError(f"{state} has no {', '.join(missing)}: is it the state folder of a gpupool hub?")
    if out.exists() and any(out.iterdir()):
        raise BackupError(f"{out} exists and is not empty: choose a new folder")
    out.mkdir(mode=0o700, parents=True, exist_ok=True)
    out.chmod(0o700)
    for name in FILES:
        src = sqlite3.connect(f"file:{state / name}?mode=ro", uri=True)
        dst = sqlite3.connect(out / name)
        try:
            src.backup(dst)  # a consistent copy, while the hub writes
        finally:
            src.close()
            dst.close()
        (out / name).chmod(0o600)
    manifest = {
        "made": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "state": str(state),
        "files": list(FILES),
        "instance": instance_of(out / "gpupool.sqlite"),
    }
    (out / MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n")
    return manifest


def restore(backup_dir: Path, state: Path, proc_root: str = "/proc") -> list[str]:
    """Put a backup's databases in place of the state's; the replaced files are kept aside. Refused
    while a hub runs on `state`. Returns what was done, one line each."""
    users = hub_processes(state, proc_root)
    if users:
        raise BackupError(f"a hub runs on {state} (pids {', '.join(map(str, users[:10]))}): stop it first")
    for name in FILES:
        path = backup_dir / name
        if not path.is_file():
            raise BackupError(f"{backup_dir} has no {name}: is it a folder `gpupool backup` made?")
        check_database(path)
    if instance_of(backup_dir / "gpupool.sqlite") is None:
        raise BackupError(f"{backup_dir / 'gpupool.sqlite'} has no instance id: not a gpupool backup")
    state.mkdir(parents=True, exist_ok=True)
    done, stamp = [], time.strftime("%Y%m%d-%H%M%S")
    for name in FILES:
        for suffix in ("", "-wal", "-shm"):
            old = state / (name + suffix)
            if old.exists():
                aside = state / f"{name}{suffix}.before-restore-{stamp}"
                os.replace(old, aside)
                done.append(f"moved {old} aside to {aside.name}")
        shutil.copyfile(backup_dir / name, state / name)
        (state / name).chmod(0o600)
        done.append(f"restored {state / name}")
    return done


def check_database(path: Path) -> None:
    try:
        con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
        try:
            (result,) = con.execute("PRAGMA integrity_check").fetchone()
        finally:
            con.close()
    except sqlite3.DatabaseError as err:
        raise BackupError(f"{path} is not a readable database: {err}") from None
    if result != "ok":
        raise BackupError(f"{path} is damaged: {result}")


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
