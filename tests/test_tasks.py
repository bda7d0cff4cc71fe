"""Background tasks the hub side starts are held until they end, and a failure is logged with
what the task was doing (asyncio alone keeps weak references and reports failures only when the
task is garbage-collected, if ever)."""

from __future__ import annotations

import asyncio
import gc
import logging

from gpupool.hub import tasks


async def test_a_failing_background_task_is_logged_with_what_it_was_doing(caplog):
    async def boom() -> None:
        await asyncio.sleep(0)
        raise RuntimeError("the API port is taken")

    with caplog.at_level(logging.ERROR, logger="gpupool"):
        task = tasks.start(boom(), "the gpupool API")
        del task
        gc.collect()  # nothing but gpupool holds the task now
        while tasks.running():
            await asyncio.sleep(0.01)
    assert "the gpupool API failed" in caplog.text and "the API port is taken" in caplog.text


async def test_a_task_is_held_until_it_ends():
    gate = asyncio.Event()

    async def wait() -> str:
        await gate.wait()
        return "done"

    tasks.start(wait(), "waiting")
    gc.collect()
    (held,) = [t for t in tasks.running() if t.get_name() == "gpupool: waiting"]
    gate.set()
    assert await held == "done"
    await asyncio.sleep(0)
    assert held not in tasks.running()


async def test_a_failed_periodic_pass_is_logged_and_the_next_one_runs(caplog):
    calls: list[int] = []

    async def tick() -> None:
        calls.append(len(calls))
        if len(calls) == 1:
            raise RuntimeError("the database is locked")

    once = tasks.guarded(tick, "training cycle")
    with caplog.at_level(logging.ERROR, logger="gpupool"):
        await once()  # fails: logged, not raised into the loop's callback
        await once()
    assert calls == [0, 1]
    assert caplog.text.count("training cycle failed") == 1 and "the database is locked" in caplog.text
    done: list[str] = []
    await tasks.guarded(lambda: done.append("pruned"), "usage retention")()  # a plain function too
    assert done == ["pruned"]
