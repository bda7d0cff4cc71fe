"""Background work the hub side starts on the hub's event loop.

asyncio keeps only weak references to tasks, so a task nobody holds may vanish mid-flight, and an
exception in one is otherwise reported only when it is garbage-collected. Every task gpupool starts
goes through `start`: held here until it ends, its failure logged with what it was doing.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine
from typing import Any

log = logging.getLogger("gpupool")

_running: set[asyncio.Task] = set()


def start(
    coro: Coroutine[Any, Any, Any], what: str, loop: asyncio.AbstractEventLoop | None = None
) -> asyncio.Task:
    """Run `coro` in the background; `what` names it in the log if it fails ("the gpupool API")."""
    task = (loop or asyncio.get_running_loop()).create_task(coro, name=f"gpupool: {what}")
    _running.add(task)
    task.add_done_callback(lambda t: _finished(t, what))
    return task


def running() -> set[asyncio.Task]:
    return set(_running)


def _finished(task: asyncio.Task, what: str) -> None:
    _running.discard(task)
    if not task.cancelled() and task.exception() is not None:
        log.error("%s failed", what, exc_info=task.exception())
