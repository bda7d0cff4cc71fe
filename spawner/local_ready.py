"""A local workspace's start returns as soon as its server listens.

After `Spawner.start()` JupyterHub looks for the server with an exponential backoff with full
jitter (waits drawn from 0–0.2, 0–0.4, … 0–5 s): a server that listens after three seconds of
imports is noticed anywhere from at once to four seconds later (measured: 0.03–4.0 s, median
1.3 s, over 26 spawns of each spawner in benchmarks/spawn). Waiting here for the server's port
with a short fixed interval, the hub's first look finds it. Only a TCP connect (no request, so
nothing in the server's log); a server that exits or never listens is left to JupyterHub's own
wait and error messages: this never raises.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from traitlets import Float, HasTraits


async def listens(host: str, port: int, timeout_s: float) -> bool:
    """Whether something accepts TCP connections at host:port (one try)."""
    try:
        _, writer = await asyncio.wait_for(asyncio.open_connection(host, port), timeout_s)
    except (TimeoutError, OSError):
        return False
    writer.close()
    try:
        await writer.wait_closed()
    except OSError:
        pass
    return True


async def wait_listening(
    host: str,
    port: int,
    running: Callable[[], Awaitable[bool]],
    timeout_s: float,
    interval_s: float,
) -> bool:
    """Until host:port accepts connections (True), or the server ended or `timeout_s` passed
    (False)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while loop.time() < deadline:
        if await listens(host, port, min(interval_s * 4, 1.0)):
            return True
        if not await running():
            return False
        await asyncio.sleep(interval_s)
    return False


class PromptReady(HasTraits):
    """Mix in before a LocalProcessSpawner."""

    ready_poll_s = Float(
        0.05,
        min=0.0,
        config=True,
        help="""How often a starting workspace's server is looked for on its port (seconds),
        so that the hub finds it as soon as it listens; JupyterHub alone looks with a
        jittered backoff of up to seconds between looks. 0 leaves it at that. Example::

            c.GPULocalProcessSpawner.ready_poll_s = 0.1
        """,
    )

    async def wait_listening(self, url: object, left_s: float) -> None:
        """Wait for the server that `start()` returned `url` for ((ip, port) or a URL), at most
        `left_s` (what is left of the hub's start_timeout: a wait here must never turn a slow
        start into a timed-out one) and at most http_timeout, the hub's own wait."""
        timeout_s = min(float(self.http_timeout), left_s - 1.0)  # type: ignore[attr-defined]
        if self.ready_poll_s <= 0 or timeout_s <= 0:
            return
        host, port = _address(url)
        if port is None:
            return

        async def running() -> bool:
            return await self.poll() is None  # type: ignore[attr-defined]

        await wait_listening(host, port, running, timeout_s, self.ready_poll_s)


def _address(url: object) -> tuple[str, int | None]:
    if isinstance(url, tuple) and len(url) == 2:
        host, port = url
        return (str(host) or "127.0.0.1"), int(port)
    if isinstance(url, str):
        from urllib.parse import urlparse

        parsed = urlparse(url)
        return (parsed.hostname or "127.0.0.1"), parsed.port
    return "127.0.0.1", None
