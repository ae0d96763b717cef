"""A request whose headers never end is answered 408 and its connection closed.

aiohttp's server has no deadline for a request's head: it waits for a whole head as long
as ``keepalive_timeout`` allows (3.14's default is an hour; 3.8's, Debian 12's, 75 s),
then closes the connection without a word. A client trickling a header a minute holds a
connection, its buffer and a file descriptor all that time, and a client whose proxy
lost the end of its head sees a dead socket instead of an answer.

So each connection's protocol is aiohttp's own (:class:`aiohttp.web.Server` makes it;
it parses HTTP, nothing here does) wrapped by :class:`HeadDeadline`, which only watches
when bytes arrive: the first bytes of a request arm a timer; aiohttp calling the
application (:meth:`Connections.middleware`, the outermost: the head was parsed whole)
disarms it; a request that ends with bytes of the next one already received arms it
again (a pipelined head). When it fires before the head was read, the connection gets a
fixed ``408 Request Timeout`` in OpenAI's error shape, with ``Connection: close``, and
is closed. An idle keep-alive connection (no byte of a new request) is left to
aiohttp's ``keepalive_timeout``. A body that is slow to come is not a head: the handler
runs then, and the client's own request bounds it.
"""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import Awaitable, Callable
from typing import cast

from aiohttp import web

from .replies import error_body

HEAD_TIMEOUT = 30.0   # seconds from a request's first byte to the end of its head
Live = dict[asyncio.BaseTransport, "HeadDeadline"]   # the connections, by transport
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def timeout_reply(seconds: float) -> bytes:
    body = json.dumps(error_body(f"the request's headers did not end within {seconds:g} s",
                                 "invalid_request_error", "request_timeout")).encode()
    return (b"HTTP/1.1 408 Request Timeout\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\nConnection: close\r\n\r\n" % len(body)) + body


class HeadDeadline(asyncio.Protocol):
    """aiohttp's protocol for one connection, and a deadline for each request's head."""

    def __init__(self, inner: asyncio.Protocol, timeout: float, live: Live):
        self.inner = inner
        self.timeout = timeout
        self.live = live
        self.transport: asyncio.Transport | None = None
        self.timer: asyncio.TimerHandle | None = None
        self.requests = 0        # requests of this connection the application is serving
        self.received = False    # bytes arrived while one was served (a pipelined head)

    # --- what the application tells ----------------------------------------------------

    def head_read(self) -> None:
        self._disarm()
        self.requests += 1
        self.received = False

    def request_ended(self) -> None:
        self.requests -= 1
        if self.requests == 0 and self.received:
            self._arm()

    # --- the transport's side, passed on to aiohttp -------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # a cast, not isinstance: uvloop's transports are no asyncio.Transport subclass
        self.transport = cast(asyncio.Transport, transport)
        self.live[transport] = self
        self.inner.connection_made(transport)

    def data_received(self, data: bytes) -> None:
        if self.requests:
            self.received = True
        elif self.timer is None:
            self._arm()
        self.inner.data_received(data)

    def eof_received(self) -> bool | None:
        return self.inner.eof_received()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        if self.transport is not None:
            self.live.pop(self.transport, None)
        self.inner.connection_lost(exc)

    def pause_writing(self) -> None:
        self.inner.pause_writing()

    def resume_writing(self) -> None:
        self.inner.resume_writing()

    # --- the deadline -------------------------------------------------------------------

    def _arm(self) -> None:
        self._disarm()
        self.timer = asyncio.get_running_loop().call_later(self.timeout, self._expired)

    def _disarm(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None

    def _expired(self) -> None:
        self.timer = None
        transport = self.transport
        if self.requests or transport is None or transport.is_closing():
            return
        transport.write(timeout_reply(self.timeout))
        transport.close()


class Connections:
    """The gateway's connections, each with its head's deadline, by transport."""

    def __init__(self) -> None:
        self.live: Live = {}

    @web.middleware
    async def middleware(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        """The outermost middleware: a request's head was read whole, its deadline is off."""
        conn = self.live.get(request.transport) if request.transport is not None else None
        if conn is None:
            return await handler(request)
        conn.head_read()
        try:
            return await handler(request)
        finally:
            conn.request_ended()


class DeadlineSite(web.BaseSite):
    """aiohttp's ``SockSite``, each connection's protocol wrapped by :class:`HeadDeadline`."""

    def __init__(self, runner: web.AppRunner, sock: socket.socket, timeout: float,
                 connections: Connections):
        super().__init__(runner)
        self.sock = sock
        self.timeout = timeout
        self.live = connections.live

    @property
    def name(self) -> str:
        host, port = self.sock.getsockname()[:2]
        return f"http://{host}:{port}"

    async def start(self) -> None:
        await super().start()
        server = self._runner.server
        assert server is not None
        self._server = await asyncio.get_running_loop().create_server(
            lambda: HeadDeadline(server(), self.timeout, self.live), sock=self.sock,
            backlog=self._backlog)
