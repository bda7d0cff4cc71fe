"""Request bodies over their endpoint's limit are refused with a JSON 413 as soon as the request's
headers arrive, before any handler runs or the body is kept in memory.

Tornado's own `max_body_size` closes the connection instead of answering, which the proxy shows as an
HTML 503; here each route's limit (a handler's `max_body`) is checked on `Content-Length` (and, for a
chunked body, as it streams in), and the refusal says which limit it was.
"""

from __future__ import annotations

import json
import re
from collections.abc import Awaitable
from typing import TYPE_CHECKING, Any, cast

from tornado import httputil
from tornado.http1connection import HTTP1Connection
from tornado.httpserver import HTTPServer

if TYPE_CHECKING:
    from tornado.web import Application

DEFAULT_MAX_BODY = 64 * 1024
DISCARD_MAX = 256 * 1024 * 1024  # read and drop a refused body up to this (keeps the reply readable)


class BodyLimits(httputil.HTTPServerConnectionDelegate):
    """Wraps a tornado Application: each request first passes its route's body limit."""

    def __init__(
        self, app: Application, limits: list[tuple[re.Pattern[str], int]], default: int = DEFAULT_MAX_BODY
    ) -> None:
        self.app, self.limits, self.default = app, limits, default

    def limit_for(self, path: str) -> int:
        path = path.split("?", 1)[0]
        return next((n for pattern, n in self.limits if pattern.fullmatch(path)), self.default)

    def start_request(
        self, server_conn: object, request_conn: httputil.HTTPConnection
    ) -> httputil.HTTPMessageDelegate:
        return _Guard(self.app.start_request(server_conn, request_conn), request_conn, self)

    def on_close(self, server_conn: object) -> None:
        self.app.on_close(server_conn)


class _Guard(httputil.HTTPMessageDelegate):
    def __init__(
        self, inner: httputil.HTTPMessageDelegate, conn: httputil.HTTPConnection, limits: BodyLimits
    ) -> None:
        # tornado's HTTPServer makes no other kind of connection (set_max_body_size is its own)
        self.inner, self.conn, self.limits = inner, cast(HTTP1Connection, conn), limits
        self.limit, self.seen, self.refused, self.started = 0, 0, False, False

    def headers_received(self, start_line: Any, headers: httputil.HTTPHeaders) -> Awaitable[None] | None:
        self.limit = self.limits.limit_for(start_line.path)
        length = headers.get("Content-Length", "")
        if length.isascii() and length.isdigit() and len(length) < 20 and int(length) > self.limit:
            self.refused = True
            if int(length) <= DISCARD_MAX:
                # read and dropped, then answered: a proxy still sending when the connection closes
                # would answer its client with an error page of its own instead of this reply
                self.conn.set_max_body_size(int(length))
            else:
                self.answer()
            return None
        self.started = True
        return self.inner.headers_received(start_line, headers)

    def data_received(self, chunk: bytes) -> Awaitable[None] | None:
        if self.refused:
            return None  # dropped
        self.seen += len(chunk)
        if self.seen > self.limit:  # a chunked body, which announced no length
            self.refused = True
            self.conn.set_max_body_size(DISCARD_MAX)
            return None
        return self.inner.data_received(chunk)

    def finish(self) -> None:
        if self.refused:
            self.answer()
        else:
            self.inner.finish()

    def on_connection_close(self) -> None:
        if self.started:
            self.inner.on_connection_close()

    def answer(self) -> None:
        body = json.dumps(
            {"status": 413, "message": f"request body over {self.limit} bytes, the limit of this endpoint"}
        ).encode()
        headers = httputil.HTTPHeaders(
            {"Content-Type": "application/json", "Content-Length": str(len(body)), "Connection": "close"}
        )
        self.conn.write_headers(
            httputil.ResponseStartLine("HTTP/1.1", 413, "Payload Too Large"), headers, body
        )
        self.conn.finish()


def serve(app: Application, limits: list[tuple[re.Pattern[str], int]], port: int, address: str) -> HTTPServer:
    """Listen with every body checked against its route's limit (the largest limit is the server's)."""
    largest = max([DEFAULT_MAX_BODY, *(n for _, n in limits)])
    # chunk_size: a refused body is read and dropped in big reads, few turns of the event loop
    server = HTTPServer(BodyLimits(app, limits), max_body_size=largest, chunk_size=1024 * 1024)
    server.listen(port, address=address)
    return server
