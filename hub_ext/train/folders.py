"""Job folders on disk: how much a running job's folder holds, and removing a finished one.

Both walk a folder the job's user controls, as a hub that may be root: by file descriptor, never
following a link (os.fwalk, shutil.rmtree's fd-based walk), and bounded in the entries counted.
"""

from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path

MAX_ENTRIES = 200_000  # a folder with more files than this counts as over any limit
NAME_MAX = 255  # bytes in one path component on Linux file systems (ext4, xfs, btrfs)


def path_component(text: str, limit: int = NAME_MAX) -> str:
    """`text` as one file name: itself when it fits `limit` bytes of UTF-8, else its longest
    prefix that does with room for '-' and 16 hex digits of its SHA-256, so two long names that
    share a prefix still get folders of their own. JupyterHub allows user names longer than a
    file name may be (a 130-character name of 257 bytes logged in but never submitted a job:
    "File name too long")."""
    raw = text.encode("utf-8", "surrogatepass")
    if len(raw) <= limit:
        return text
    digest = hashlib.sha256(raw).hexdigest()[:16]
    head = raw[: limit - len(digest) - 1].decode("utf-8", "ignore")  # never half a character
    return f"{head}-{digest}"


def user_jobs_folder(jobs_root: str, owner: str) -> Path:
    """c.TrainPool.jobs_root with {username} replaced by a name that fits a path component."""
    return Path(jobs_root.format(username=path_component(owner))).resolve()


def folder_bytes(path: str, stop_over: int = 0) -> int:
    """Disk space used by the folder (allocated blocks: a sparse file counts what it holds); stops
    counting once over `stop_over` (0: never) or past MAX_ENTRIES entries (then a huge number)."""
    total, entries = 0, 0
    try:
        walk = os.fwalk(path, follow_symlinks=False)
        for _, dirs, files, dir_fd in walk:
            for name in (*dirs, *files):
                entries += 1
                if entries > MAX_ENTRIES:
                    return 1 << 62
                try:
                    total += os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_blocks * 512
                except OSError:
                    continue
            if stop_over and total > stop_over:
                return total
    except OSError:
        return total
    return total


def remove_folder(path: str) -> bool:
    """Remove a job's folder and all in it; False when it could not be removed (it is kept)."""
    if not shutil.rmtree.avoids_symlink_attacks:  # only fd-based removal is safe in a user's folder
        return False
    try:
        shutil.rmtree(path)
    except FileNotFoundError:
        return True
    except OSError:
        return False
    return True
