"""Background work the hub side starts on the hub's event loop.

asyncio keeps only weak references to tasks, so a task nobody holds may vanish mid-flight, and an
exception in one is otherwise reported only when it is garbage-collected. Every task gpupool starts
goes through `start`: held here until it ends, its failure logged with what it was doing.
Periodic passes go through `every`: a pass that fails is logged and the next one runs.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine

from jupyterhub.utils import maybe_future
from tornado.ioloop import IOLoop, PeriodicCallback

log = logging.getLogger("gpupool")

_running: set[asyncio.Task[object]] = set()


def start(
    coro: Coroutine[object, object, object], what: str, loop: asyncio.AbstractEventLoop | None = None
) -> asyncio.Task[object]:
    """Run `coro` in the background; `what` names it in the log if it fails ("the gpupool API")."""
    task = (loop or asyncio.get_running_loop()).create_task(coro, name=f"gpupool: {what}")
    _running.add(task)
    task.add_done_callback(lambda t: _finished(t, what))
    return task


def running() -> set[asyncio.Task[object]]:
    return set(_running)


def _finished(task: asyncio.Task[object], what: str) -> None:
    _running.discard(task)
    if not task.cancelled() and task.exception() is not None:
        log.error("%s failed", what, exc_info=task.exception())


def guarded(work: Callable[[], object], what: str) -> Callable[[], Coroutine[object, object, None]]:
    """One pass of `work` (a function, or a coroutine function) whose failure is logged with
    `what` it was doing ("granting resume claims") instead of ending the passes that follow."""

    async def once() -> None:
        try:
            await maybe_future(work())  # JupyterHub's own: a plain value or an awaitable
        except Exception:  # noqa: BLE001 - one bad pass must not stop the next
            log.exception("%s failed", what)

    return once


def every(
    seconds: float, work: Callable[[], object], what: str, first_after: float | None = None
) -> PeriodicCallback:
    """Run `work` every `seconds` on the hub's loop, each pass `guarded` (PeriodicCallback waits
    for an async pass to end before planning the next: passes never overlap). `first_after`: one
    extra pass that many seconds after start (a retention pass that should not wait a whole
    period). Returns the started callback (stop() ends it)."""
    once = guarded(work, what)
    if first_after is not None:
        IOLoop.current().call_later(first_after, once)
    periodic = PeriodicCallback(once, seconds * 1000)
    periodic.start()
    return periodic
