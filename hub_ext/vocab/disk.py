"""A full disk, said as such: the errors that mean it, from files and from the database."""

from __future__ import annotations

import errno


def disk_full(exc: BaseException | None) -> str:
    """What is full, when `exc` is a full disk (an OSError ENOSPC, or the database saying so)."""
    if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return f"{exc.filename or 'a file'}: {exc.strerror}" if exc.filename else str(exc.strerror)
    text = str(getattr(exc, "orig", "") or "") if type(exc).__module__.startswith("sqlalchemy") else ""
    if "disk is full" in text or "No space left" in text:
        return f"the database: {text}"
    return ""
