"""The gateway's own bounds on a connection that does not send its request: a silent
connection is closed, a head that never ends is answered 408, and near the descriptor
limit the idle connections are closed first.

aiohttp's server has no deadline for a request's head, and whether it closes a
connection that sends nothing depends on its version: 3.14 (the test venv's) closes one
after ``keepalive_timeout``; 3.8.4 and 3.11.16, Debian 12's and 13's, which the package
runs on, arm no timer for a connection that never sent a byte (issue 45, item 1). In the
Debian 12 container 16,504 silent connections filled the gateway's 16,384 descriptors
and an honest ``/health`` went unanswered: anyone who could reach the port, before any
key. So nothing here is left to aiohttp; each rule for the failure it prevents:

- a new connection that sends no byte within :data:`SILENT_TIMEOUT` (30 s) of opening
  is closed, without an answer (it asked nothing). A silent connection holds a
  descriptor and a buffer; on Debian's aiohttp it held them until the gateway's restart;
- an idle keep-alive connection (its answer sent, no byte of a next request) is closed
  after :data:`KEEPALIVE` (75 s, aiohttp 3.8's and nginx's). It is longer than a new
  connection's bound because such a client has shown it is one: closing its connection
  costs it a new handshake, nothing else (clients expect an idle close);
- a request's head must end within :data:`HEAD_TIMEOUT` (30 s) of its first byte, else
  a fixed ``408 Request Timeout`` in OpenAI's error shape with ``Connection: close``, and
  the connection is closed: a client trickling a header a minute would hold its
  connection as long as it liked, and a client whose proxy lost the end of its head
  would see a dead socket instead of an answer. A body that is slow to come is not a
  head: the handler runs then, and the client's own request bounds it. The 408 is
  followed by a half-close (FIN), and what the client still sends is read and dropped
  for :data:`LINGER` seconds before the close (a lingering close, RFC 9112 9.6): closed
  at once, the next bytes of a head still trickling in made the kernel answer a reset,
  which destroys the 408 in the client's buffer (the test of a trickled head saw
  ``Connection reset by peer`` in the Debian 13 container, now and then). Not near the
  descriptor limit, where a descriptor held is the failure;
- when the connections open (each one busy with a request counted twice: the engine's
  or peer's connection beside it) reach the process's descriptor limit
  (``RLIMIT_NOFILE``, ``LimitNOFILE=`` of the unit) less a reserve of an eighth of it
  (at least 64: the bus, the journal, the listening sockets, the pools), the idle ones
  (no request being served: silent, between requests, or in the middle of a head) are
  closed, the longest idle first, down to a sixteenth below that mark. A flood of
  connections opened faster than the bounds above close them would otherwise exhaust
  the descriptors: accept() then fails, and an honest client (a ``/health`` check, a
  request) waits in the backlog unanswered. A connection serving a request is never
  closed so; a client connecting now is the newest, so the last an eviction reaches.
  The log says so, once a minute at most, with the figures.

Each connection's protocol is aiohttp's own (:class:`aiohttp.web.Server` makes it; it
parses HTTP, nothing here does) wrapped by :class:`HeadDeadline`, which only watches when
bytes arrive and when the application is called (:meth:`Connections.middleware`, the
outermost: the head was parsed whole) and returns. One timer per connection, re-armed at
those moments, never per byte.
"""

from __future__ import annotations

import asyncio
import heapq
import json
import logging
import resource
import socket
import time
from collections.abc import Awaitable, Callable
from typing import cast

from aiohttp import web

from .replies import error_body

log = logging.getLogger("lokid.gateway")

HEAD_TIMEOUT = 30.0     # seconds from a request's first byte to the end of its head
SILENT_TIMEOUT = 30.0   # seconds a new connection may stay silent before it is closed
LINGER = 2.0            # seconds a 408's connection reads and drops before its close
KEEPALIVE = 75.0        # seconds an idle keep-alive connection stays open (aiohttp 3.8's, nginx's)
LOG_EVERY = 60.0        # seconds between two lines about connections closed near the limit
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def timeout_reply(seconds: float) -> bytes:
    body = json.dumps(error_body(f"the request's headers did not end within {seconds:g} s",
                                 "invalid_request_error", "request_timeout")).encode()
    return (b"HTTP/1.1 408 Request Timeout\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\nConnection: close\r\n\r\n" % len(body)) + body


def descriptor_limit() -> int:
    """This process's soft limit on open descriptors."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    return soft if soft != resource.RLIM_INFINITY and soft > 0 else 1 << 20


def connection_cap(limit: int) -> int:
    """The connections' share of ``limit`` descriptors: all but a reserve for the rest."""
    return max(1, limit - max(64, limit // 8))


class Connections:
    """The gateway's connections by transport, with the bounds above.

    ``cap``: the descriptors the connections may take (busy ones count twice); by default
    :func:`connection_cap` of this process's limit, read when the first one opens."""

    def __init__(self, head: float = HEAD_TIMEOUT, silent: float = SILENT_TIMEOUT,
                 keepalive: float = KEEPALIVE, cap: int | None = None) -> None:
        self.head = head
        self.silent = silent
        self.keepalive = keepalive
        self.cap = cap
        self.live: dict[asyncio.BaseTransport, HeadDeadline] = {}
        self.busy = 0          # connections with a request being served
        self.closing = 0       # closed by a bound here, their descriptor freed next
        self.evicted = 0       # closed near the limit since the last line said so
        self.said = -LOG_EVERY

    def protocol(self, inner: asyncio.Protocol) -> HeadDeadline:
        return HeadDeadline(inner, self)

    def load(self) -> int:
        """Descriptors the connections take: one each, two for a busy one. Those closed
        here are not counted (their descriptor goes at the loop's next turn): counted,
        each connection accepted in the same turn would close another batch."""
        return len(self.live) + self.busy - self.closing

    def opened(self, conn: HeadDeadline) -> None:
        if self.cap is None:
            self.cap = connection_cap(descriptor_limit())
        if self.load() > self.cap:
            self._evict(conn)

    def _evict(self, newest: HeadDeadline) -> None:
        """Close the longest idle connections until the load is a sixteenth below the cap."""
        assert self.cap is not None
        want = self.load() - (self.cap - max(1, self.cap // 16))
        idle = (c for c in self.live.values() if not c.requests and c is not newest
                and not c.closed)
        closed = 0
        for conn in heapq.nsmallest(want, idle, key=lambda c: c.idle_since):
            conn.close_idle()
            closed += 1
        self.evicted += closed
        now = time.monotonic()
        if now - self.said >= LOG_EVERY:
            log.warning("connections near this process's limit of %d descriptors: closed "
                        "%d idle ones, the longest idle first (%d left open, %d of them "
                        "serving a request)", descriptor_limit(), self.evicted,
                        len(self.live) - self.closing, self.busy)
            self.said, self.evicted = now, 0

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


class HeadDeadline(asyncio.Protocol):
    """aiohttp's protocol for one connection, and its bounds: silent, idle, head."""

    def __init__(self, inner: asyncio.Protocol, connections: Connections):
        self.inner = inner
        self.connections = connections
        self.transport: asyncio.Transport | None = None
        self.timer: asyncio.TimerHandle | None = None
        self.requests = 0         # requests of this connection the application is serving
        self.received = False     # bytes of a next request arrived (while idle or served)
        self.closed = False       # by close_idle, its connection_lost still to come
        self.lingering = False    # its 408 sent and half-closed: what comes is dropped
        self.idle_since = time.monotonic()   # when it last began to wait for a request

    # --- what the application tells ----------------------------------------------------

    def head_read(self) -> None:
        self._disarm()
        if self.requests == 0:
            self.connections.busy += 1
        self.requests += 1
        self.received = False

    def request_ended(self) -> None:
        self.requests -= 1
        if self.requests:
            return
        self.connections.busy -= 1
        self.idle_since = time.monotonic()
        if self.received:    # a pipelined head: its deadline from now
            self._arm(self.connections.head, self._head_expired)
        else:
            self._arm(self.connections.keepalive, self.close_idle)

    # --- the transport's side, passed on to aiohttp -------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # a cast, not isinstance: uvloop's transports are no asyncio.Transport subclass
        self.transport = cast(asyncio.Transport, transport)
        self.connections.live[transport] = self
        self.inner.connection_made(transport)
        self._arm(self.connections.silent, self.close_idle)
        self.connections.opened(self)

    def data_received(self, data: bytes) -> None:
        if self.lingering:
            return
        if not self.received:
            self.received = True
            if not self.requests:   # the first byte of a head: its deadline
                self._arm(self.connections.head, self._head_expired)
        self.inner.data_received(data)

    def eof_received(self) -> bool | None:
        if self.lingering:
            return None   # the client is done too: the transport closes
        return self.inner.eof_received()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        if self.closed:
            self.closed = False
            self.connections.closing -= 1
        if self.transport is not None and \
                self.connections.live.pop(self.transport, None) is not None and self.requests:
            self.connections.busy -= 1
            self.requests = 0
        self.inner.connection_lost(exc)

    def pause_writing(self) -> None:
        self.inner.pause_writing()

    def resume_writing(self) -> None:
        self.inner.resume_writing()

    # --- the bounds -----------------------------------------------------------------------

    def _arm(self, seconds: float, then: Callable[[], None]) -> None:
        self._disarm()
        self.timer = asyncio.get_running_loop().call_later(seconds, then)

    def _disarm(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None

    def close_idle(self, linger: bool = False) -> None:
        """Close a connection that serves no request: with a 408 where a head had begun
        (``linger``: half-closed first, see the module's docstring), without a word where
        nothing was asked."""
        self._disarm()
        transport = self.transport
        if self.requests or transport is None or transport.is_closing() or self.lingering:
            return
        self.closed = True
        self.connections.closing += 1
        if self.received:
            transport.write(timeout_reply(self.connections.head))
            if linger and transport.can_write_eof():
                transport.write_eof()
                self.lingering = True
                self._arm(LINGER, transport.close)
                return
        transport.close()

    def _head_expired(self) -> None:
        self.timer = None
        self.close_idle(linger=True)


class DeadlineSite(web.BaseSite):
    """aiohttp's ``SockSite``, each connection's protocol wrapped by :class:`HeadDeadline`."""

    def __init__(self, runner: web.AppRunner, sock: socket.socket,
                 connections: Connections):
        super().__init__(runner)
        self.sock = sock
        self.connections = connections

    @property
    def name(self) -> str:
        host, port = self.sock.getsockname()[:2]
        return f"http://{host}:{port}"

    async def start(self) -> None:
        await super().start()
        server = self._runner.server
        assert server is not None
        self._server = await asyncio.get_running_loop().create_server(
            lambda: self.connections.protocol(server()), sock=self.sock,
            backlog=self._backlog)
