"""An HTTPS relay between a client under test (the hub's kubernetes_asyncio) and the API server:
every request is passed on as it is (the client's token included) and every answer streamed
back, so that a test can do what a slow or broken network does to one request: hold a watch
request back until the test lets it go (by then the resourceVersion it resumes from may be
compacted away: the API server itself answers 410 Gone), and drop the open connections.

It serves the plane's own certificate (valid for 127.0.0.1, signed by the plane's CA): the
client's kubeconfig only names another port."""

from __future__ import annotations

import asyncio
import ssl
from dataclasses import dataclass, field

import aiohttp
from aiohttp import web

from tests.cluster.plane import ControlPlane

HOP = {"host", "content-length", "transfer-encoding", "connection", "keep-alive"}


@dataclass
class Relayed:
    """What the relay passed back for one request."""

    method: str
    path_qs: str
    status: int = 0
    head: bytes = b""  # the answer's first bytes (a watch's first events)


@dataclass
class WatchRelay:
    plane: ControlPlane
    hold_watches_of: str = ""  # a path (".../jobs"): its next watch requests wait for `release`
    release: asyncio.Event = field(default_factory=asyncio.Event)
    held: list[str] = field(default_factory=list)  # the path and query of each request held
    relayed: list[Relayed] = field(default_factory=list)
    _responses: set = field(default_factory=set)

    async def start(self) -> int:
        server_ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        server_ctx.load_cert_chain(str(self.plane.certs.server_cert), str(self.plane.certs.server_key))
        client_ctx = ssl.create_default_context(cafile=str(self.plane.certs.ca))
        self.session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(ssl=client_ctx), timeout=aiohttp.ClientTimeout(total=None)
        )
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self._relay)
        # its watches stream for minutes: at the end they are cut, not waited for (60 s by default)
        self.runner = web.AppRunner(app, shutdown_timeout=1.0)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0, ssl_context=server_ctx)
        await site.start()
        return site._server.sockets[0].getsockname()[1]

    async def _relay(self, request: web.Request) -> web.StreamResponse:
        record = Relayed(request.method, request.path_qs)
        self.relayed.append(record)
        watch = request.query.get("watch") in ("1", "true", "True")
        if watch and self.hold_watches_of and request.path == self.hold_watches_of:
            self.held.append(request.path_qs)
            await self.release.wait()
        headers = {k: v for k, v in request.headers.items() if k.lower() not in HOP}
        async with self.session.request(
            request.method, self.plane.url + request.path_qs, headers=headers, data=await request.read()
        ) as up:
            record.status = up.status
            out = web.StreamResponse(
                status=up.status, headers={k: v for k, v in up.headers.items() if k.lower() not in HOP}
            )
            await out.prepare(request)
            self._responses.add(request.transport)
            try:
                async for chunk in up.content.iter_any():
                    if len(record.head) < 4096:
                        record.head += chunk[: 4096 - len(record.head)]
                    await out.write(chunk)
            finally:
                self._responses.discard(request.transport)
            return out

    def drop_connections(self) -> None:
        """What a network outage does to the requests in flight (a watch among them)."""
        for transport in list(self._responses):
            if transport is not None:
                transport.close()

    async def stop(self) -> None:
        self.release.set()
        self.drop_connections()
        await self.session.close()  # ends the relayed streams from the API server's side too
        await self.runner.cleanup()
