"""A local workspace's start returns once its server listens (spawner/local_ready.py), so the
hub's first look finds it; a server that dies or never listens is left to JupyterHub."""

from __future__ import annotations

import asyncio
import socket

from gpupool.spawner.local_ready import PromptReady, wait_listening


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_returns_as_soon_as_the_server_listens() -> None:
    looks_at_process = []

    async def scenario() -> bool:
        port = free_port()
        servers: list[asyncio.Server] = []

        async def running() -> bool:  # after the first look failed, the server binds its port
            looks_at_process.append(1)
            if not servers:
                servers.append(await asyncio.start_server(lambda r, w: w.close(), "127.0.0.1", port))
            return True

        found = await wait_listening("127.0.0.1", port, running, timeout_s=30, interval_s=0.01)
        servers[0].close()
        return found

    assert asyncio.run(scenario())
    assert looks_at_process == [1]  # found at the next look, not at the timeout


def test_a_server_that_died_is_left_to_the_hub() -> None:
    calls = []

    async def dead() -> bool:
        calls.append(1)
        return False

    async def scenario() -> bool:
        return await wait_listening("127.0.0.1", free_port(), dead, timeout_s=30, interval_s=0.02)

    assert asyncio.run(scenario()) is False
    assert len(calls) == 1  # one look at the process, no wait for the timeout


class Spawner(PromptReady):
    http_timeout = 30
    polls = 0

    async def poll(self) -> int | None:
        self.polls += 1
        return None


def test_the_wait_never_outlasts_the_start_timeout() -> None:
    spawner = Spawner(ready_poll_s=0.02)

    async def scenario() -> float:
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        await spawner.wait_listening(("127.0.0.1", free_port()), left_s=1.5)  # 0.5 s of it may go
        return loop.time() - t0

    waited = asyncio.run(scenario())
    assert 0.4 <= waited < 1.4
    assert spawner.polls > 0
    spawner.polls = 0
    asyncio.run(spawner.wait_listening(("", free_port()), left_s=0.9))  # under the 1 s margin
    assert spawner.polls == 0


def test_zero_turns_it_off() -> None:
    spawner = Spawner(ready_poll_s=0)
    asyncio.run(spawner.wait_listening(("127.0.0.1", free_port()), left_s=60))
    assert spawner.polls == 0
