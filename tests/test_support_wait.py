"""The shared wait (tests/support/wait.py): it returns what it waited for, and when the thing
never happens it fails saying what was awaited, the last value seen and the detail asked for."""

from __future__ import annotations

import asyncio

import pytest

from tests.support.wait import until, until_async


def test_until_returns_the_first_truthy_value_and_steps_between_checks() -> None:
    seen: list[int] = []
    assert until(
        lambda: len(seen) >= 3 and seen, "three steps", every=0.001, step=lambda: seen.append(1)
    ) == [1, 1, 1]


def test_until_names_what_it_waited_for_the_last_value_and_the_detail() -> None:
    with pytest.raises(AssertionError) as failed:
        until(
            lambda: [], "the queue to fill", timeout=0.05, every=0.01, detail=lambda: "log tail: nothing ran"
        )
    assert str(failed.value) == (
        "timed out after 0.05 s waiting for the queue to fill; last value seen: []\nlog tail: nothing ran"
    )


def test_an_assertion_inside_the_check_ends_the_wait_at_once() -> None:
    def check() -> bool:
        raise AssertionError("the job failed")

    with pytest.raises(AssertionError, match="^the job failed$"):
        until(check, "never", timeout=60)


def test_until_async_lets_the_loop_run_between_checks() -> None:
    async def main() -> str:
        box: list[str] = []
        asyncio.get_running_loop().call_later(0.01, box.append, "event")
        return (await until_async(lambda: box, "the event", every=0.001))[0]

    assert asyncio.run(main()) == "event"
    with pytest.raises(AssertionError, match="waiting for a watch event; last value seen: None"):
        asyncio.run(until_async(lambda: None, "a watch event", timeout=0.02, every=0.005))
