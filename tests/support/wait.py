"""The one way tests wait for something real to happen: a process to start or exit, a hub to
answer, a file to appear, a watch event to arrive.

Only for what runs on its own clock. Where the code under test takes `now`, travel the time
instead (pass a later `now`); never wait for it.

    until(lambda: path.exists(), f"{path} written")
    job = until(lambda: done(svc.job(job_id)), "the job ends", step=lambda: svc.tick(now), detail=svc.jobs)
    await until_async(lambda: svc.job(job_id).state == "running", "the job runs")
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")

# Generous on purpose: CI is a slow 2-core box that runs hubs, kernels and browsers side by side.
# A passing check returns at once, so a long timeout costs nothing until something is broken.
# A tenth of a second between checks: a hub answers a poll at that rate without noticing, and
# some tests must see a short-lived state (a process a job leaves behind) before it passes.
TIMEOUT_S = 90.0
EVERY_S = 0.1


def _timed_out(
    what: str, timeout: float, value: object, detail: Callable[[], object] | None
) -> AssertionError:
    text = f"timed out after {timeout:g} s waiting for {what}; last value seen: {value!r}"
    if detail is not None:
        text += f"\n{detail()}"
    return AssertionError(text)


def until(
    check: Callable[[], T],
    what: str,
    *,
    timeout: float = TIMEOUT_S,
    every: float = EVERY_S,
    step: Callable[[], object] | None = None,
    detail: Callable[[], object] | None = None,
) -> T:
    """Call `check` until it returns something truthy, and return that value.

    `what` names the awaited event for the failure message, which also shows the last value
    `check` returned and `detail()` (a log tail, the jobs' state) when given. `step` runs between
    two checks, after the pause (a scheduler tick at a fixed `now` while real processes run).
    An exception from `check` (or an assertion in it) ends the wait at once."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise _timed_out(what, timeout, value, detail)
        time.sleep(every)
        if step is not None:
            step()


async def until_async(
    check: Callable[[], T],
    what: str,
    *,
    timeout: float = TIMEOUT_S,
    every: float = EVERY_S,
    detail: Callable[[], object] | None = None,
) -> T:
    """`until` inside an event loop: the loop runs (watches, informers) between two checks."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise _timed_out(what, timeout, value, detail)
        await asyncio.sleep(every)
