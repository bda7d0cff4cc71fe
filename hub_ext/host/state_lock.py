"""One owner of a state folder at a time: the embedded hub, or `gpupool stop-jobs`.

Both take an exclusive `flock` on `<state>/hub.lock` and keep it until their process ends, so the
kernel, not a look at the process list, keeps a hub from starting while stop-jobs is ending its
jobs (both would settle the same runs and release the same GPUs), and stop-jobs from running beside
a hub. The lock goes with the process, however it ends: a crashed hub leaves nothing stale. The
descriptor is close-on-exec, so the servers and jobs the hub starts never hold it.
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

NAME = "hub.lock"


class StateBusy(Exception):
    """Another process owns the state folder: the message says which kind."""


def hold_state(state: str | Path, who: str) -> int:
    """Take `state`'s lock for this process's lifetime; `who` is what this process is, for the
    message another one reads. Never follows a link planted at the lock's name."""
    path = Path(state) / NAME
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.pread(fd, 200, 0).decode(errors="replace").strip() or "another process"
        os.close(fd)
        raise StateBusy(f"{state} is in use by {holder}") from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{who} (pid {os.getpid()})\n".encode(), 0)
    return fd
