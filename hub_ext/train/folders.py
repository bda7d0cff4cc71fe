"""Job folders on disk: how much a running job's folder holds, and removing a finished one.

Both walk a folder the job's user controls, as a hub that may be root: by file descriptor, never
following a link (os.fwalk, shutil.rmtree's fd-based walk), and bounded in the entries counted.
"""

from __future__ import annotations

import os
import shutil

MAX_ENTRIES = 200_000  # a folder with more files than this counts as over any limit


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
