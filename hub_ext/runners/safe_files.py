"""Files in a job's folder, opened by a hub that may be root.

A job's folder belongs to the job's account, so everything in it is under the user's
control: `job.log` may have become a symbolic link to /etc/shadow, `checkpoint` a file, a
hard link may point at a root-only file. The hub therefore never opens anything there by
path. It opens the folder itself with O_NOFOLLOW and checks that it belongs to the job's
account, then opens names *relative to that folder* with O_NOFOLLOW and keeps a file only
if it is a regular file with one link, owned by the job's account. Anything else is
refused with UnsafePath, and the caller treats it as the user's own mistake (a failed
start, an empty log) rather than following it.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from contextlib import contextmanager

NOFOLLOW = os.O_NOFOLLOW | os.O_CLOEXEC


class UnsafePath(OSError):
    """A file or folder in a user-writable place that the hub will not follow."""


@contextmanager
def folder(path: str, uid: int) -> Iterator[int]:
    """An fd of the job folder `path`, which must be a real folder owned by `uid`."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | NOFOLLOW)
    except OSError as err:
        raise UnsafePath(err.errno, f"job folder {path}: {err.strerror}") from None
    try:
        st = os.fstat(fd)
        if st.st_uid != uid:
            raise UnsafePath(f"job folder {path} belongs to uid {st.st_uid}, not the job's account ({uid})")
        yield fd
    finally:
        os.close(fd)


def open_file(dir_fd: int, name: str, flags: int, uid: int, gid: int = -1, create: bool = False) -> int:
    """Open `name` inside the folder `dir_fd` without following links.

    With `create`, a missing file is made (exclusively) and given to `uid`/`gid`. The file
    must be a regular file with a single link owned by `uid`: a hard link to another
    account's file is refused like a symbolic link.
    """
    # O_NONBLOCK: a FIFO planted under the name must not hang the hub's event loop
    base = flags | NOFOLLOW | os.O_NONBLOCK
    try:
        fd = os.open(name, base, dir_fd=dir_fd)
    except FileNotFoundError:
        if not create:
            raise
        fd = os.open(name, base | os.O_CREAT | os.O_EXCL, 0o600, dir_fd=dir_fd)
        if os.geteuid() == 0:
            os.fchown(fd, uid, gid)
    except OSError as err:
        raise UnsafePath(err.errno, f"{name}: {err.strerror} (links are not followed)") from None
    st = os.fstat(fd)
    why = (
        "not a regular file"
        if not stat.S_ISREG(st.st_mode)
        else f"{st.st_nlink} hard links"
        if st.st_nlink != 1
        else f"owned by uid {st.st_uid}, not the job's account ({uid})"
        if st.st_uid != uid
        else ""
    )
    if why:
        os.close(fd)
        raise UnsafePath(f"{name}: {why}; the hub does not open it")
    os.set_blocking(fd, True)
    return fd


def ensure_folder(dir_fd: int, name: str, uid: int, gid: int) -> None:
    """`name` inside `dir_fd` is a folder owned by `uid` (made if missing), never a link."""
    try:
        os.mkdir(name, 0o700, dir_fd=dir_fd)
        made = True
    except FileExistsError:
        made = False
    st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    if not stat.S_ISDIR(st.st_mode):
        raise UnsafePath(f"{name} is not a folder (it was replaced by a file or a link)")
    if made and os.geteuid() == 0:
        os.chown(name, uid, gid, dir_fd=dir_fd, follow_symlinks=False)
    elif not made and st.st_uid != uid:
        raise UnsafePath(f"{name} belongs to uid {st.st_uid}, not the job's account ({uid})")


def read_small(dir_fd: int, name: str, uid: int, limit: int = 4096) -> bytes:
    """At most `limit` bytes of a small file (an exit record), checked as open_file does."""
    fd = open_file(dir_fd, name, os.O_RDONLY, uid)
    try:
        return os.read(fd, limit)
    finally:
        os.close(fd)


def is_file(dir_fd: int, name: str) -> bool:
    """A regular file (not a link) of that name exists in the folder."""
    try:
        return stat.S_ISREG(os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode)
    except OSError:
        return False


def tail_text(
    data: bytes, lines: int, before: int | None = None, max_bytes: int = 1 << 20
) -> tuple[list[str], int]:
    """`tail_lines` on bytes already read (a pod's log from the API server): the same lines and
    the same offset as `tail_lines` on a file holding `data`."""
    end = len(data) if before is None else max(0, min(before, len(data)))
    start = max(0, end - max_bytes)
    window = data[start:end]
    if lines and start > 0:  # as tail_lines: read back only until a newline more than needed is seen
        cut = len(window)
        for _ in range(lines + 1):
            cut = window.rfind(b"\n", 0, cut)
            if cut < 0:
                break
        if cut > 0:
            start, window = start + cut, window[cut:]
    parts = window.split(b"\n")
    if parts and parts[-1] == b"":
        parts.pop()
    keep = parts[-lines:] if lines else []
    first = end - (sum(len(x) + 1 for x in keep) - (0 if window.endswith(b"\n") else 1)) if keep else end
    return [x.decode(errors="replace") for x in keep], max(first, start)


def tail_lines(
    fd: int, lines: int, before: int | None = None, max_bytes: int = 1 << 20, block: int = 64 * 1024
) -> tuple[list[str], int]:
    """The last `lines` lines that end before byte offset `before` (default: the end of
    the file), read backwards in blocks and never more than `max_bytes`; with the offset
    where the first returned line starts, to page further back."""
    size = os.fstat(fd).st_size
    end = size if before is None else max(0, min(before, size))
    chunks: list[bytes] = []
    start, newlines = end, 0
    while start > 0 and newlines <= lines and end - start < max_bytes:
        step = min(block, start, max_bytes - (end - start))
        start -= step
        chunk = os.pread(fd, step, start)
        chunks.insert(0, chunk)
        newlines += chunk.count(b"\n")
    data = b"".join(chunks)
    # a final line without a newline still counts; the first may be cut by the byte bound
    parts = data.split(b"\n")
    if parts and parts[-1] == b"":
        parts.pop()
    keep = parts[-lines:] if lines else []
    first = end - (sum(len(p) + 1 for p in keep) - (0 if data.endswith(b"\n") else 1)) if keep else end
    return [p.decode(errors="replace") for p in keep], max(first, start)
