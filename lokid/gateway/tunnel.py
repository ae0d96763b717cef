"""A streamed answer carried as bytes (issue 31, item 3): no parse of it per chunk.

Through aiohttp's client, each chunk of an engine's stream was parsed by its HTTP
parser, queued in a stream reader, handed to the relaying task (one wake-up of it per
chunk) and written again by aiohttp's server: 30 µs of the gateway's CPU per token
where systemd-socket-proxyd, which copies bytes, spends 15-17. A request that asks to
stream (``"stream": true`` at its top level) to one of this host's engines goes here
instead, on a connection of its own:

- the request is written as it came (its head rebuilt from the forwarded headers, its
  body as read, ``Connection: close``); the answer's head is read and parsed once;
- an answer in chunks (what llama-server streams) is then carried by the engine's
  connection's protocol itself: each read is cut out of its chunk framing (sizes found,
  nothing parsed inside) and written to the client's connection as one chunk, from the
  event loop's read callback, with no task woken; aiohttp's response still writes the
  head (its hooks: CORS, the drain's count) and the last chunk;
- an answer with a length up to :data:`WHOLE` (an error, a refusal) is read whole and
  answered as such; a longer one is carried as it comes, its length kept, and so is one
  delimited by the end of its connection (a 600 MiB answer read whole held the
  gateway's memory, issue 45, item 2); between the head and the carrying, the engine's
  reads pause once :data:`HIGH` bytes wait;
- the gateway's rules stay: the engine's connection is never pooled (it is closed at the
  end); a client gone is seen at the next read and closes the engine's connection,
  which frees its slot (499); an engine gone, or silent past its patience
  (:class:`lokid.gateway.silence.StreamWatch`), ends an event stream with a last error
  event; a client slower than the engine pauses the engine's reads (its buffer is
  bounded).

An answer whose head the gateway sent already (``told``: the client was told it waited,
:mod:`lokid.gateway.waitnotes`) is carried into that response: a 200 stream's chunks as
they are (its head dropped), an answer with a length framed as chunks; an engine's
other status is :class:`Refused`, which the relay turns into a last error event.

A peer gateway's stream (plain HTTP) is carried so too: a connection never made there
goes to another replica, as on the relay's path. HTTP/1.0 clients and external APIs
(TLS, their model renamed in the answer) keep the relay's path.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping
from typing import cast

from aiohttp import web
from multidict import CIMultiDict

from .silence import EngineSilent, HeadWatch, Patience, StreamWatch, within
from .sockets import Route, open_engine

log = logging.getLogger("lokid.gateway")

MAX_HEAD = 64 * 1024          # bytes of the answer's head, at most
WHOLE = 1024 * 1024           # bytes of an answer with a length read whole, at most
HIGH, LOW = 256 * 1024, 64 * 1024   # the client's write buffer: pause the engine above
RESUME_EVERY = 0.005          # seconds between looks at a paused client's buffer
CONNECT_TIMEOUT = 10.0        # as the relay's pool's (TimeoutError: an OSError, a 502)


class EngineGone(Exception):
    """The engine's connection ended before its answer did."""


class ClientLeft(Exception):
    """The client's connection closed mid-answer."""


class Refused(Exception):
    """An engine's answer other than 200 after the gateway's own head was sent: its
    status and its body (up to WHOLE bytes; empty when it streamed)."""

    def __init__(self, status: int, body: bytes):
        super().__init__(f"the engine answered {status}")
        self.status, self.body = status, body


class _Head:
    __slots__ = ("status", "reason", "headers", "chunked", "length")

    def __init__(self, status: int, reason: str, headers: CIMultiDict[str], chunked: bool,
                 length: int | None):
        self.status, self.reason, self.headers = status, reason, headers
        self.chunked, self.length = chunked, length


def _parse_head(raw: bytes) -> _Head:
    lines = raw.decode("utf-8", "surrogateescape").split("\r\n")   # as aiohttp's parser
    parts = lines[0].split(" ", 2)
    if len(parts) < 2 or not parts[0].startswith("HTTP/1.") or not parts[1].isdigit():
        raise EngineGone(f"an answer that is not HTTP/1.x: {lines[0][:80]!r}")
    headers: CIMultiDict[str] = CIMultiDict()
    for line in lines[1:]:
        name, sep, value = line.partition(":")
        if sep and name and name == name.strip():
            headers.add(name, value.strip())
    chunked = "chunked" in headers.get("Transfer-Encoding", "").lower()
    length = headers.get("Content-Length")
    return _Head(int(parts[1]), parts[2] if len(parts) > 2 else "", headers, chunked,
                 int(length) if length is not None and length.isdigit() else None)


def _whole(head: _Head) -> bool:
    """Whether an answer is read whole: a length, and a short one."""
    return head.length is not None and not head.chunked and head.length <= WHOLE


def _one_chunk(data: bytes) -> int:
    """Where the payload begins when ``data`` is exactly one whole chunk, not the last
    (what llama-server writes per event, and mostly what one read gets: carried as it
    is); 0 when it is not."""
    eol = data.find(b"\r\n", 0, 18)
    if eol <= 0:
        return 0
    try:
        size = int(data[:eol], 16)
    except ValueError:   # an extension (";"), or no size
        return 0
    return eol + 2 if size > 0 and len(data) == eol + 4 + size and data.endswith(b"\r\n") \
        else 0


class _Engine(asyncio.Protocol):
    """The engine's side: the head (a future), then the body, whole or carried."""

    def __init__(self, tap: Callable[[bytes], None] | None = None) -> None:
        self.loop = asyncio.get_running_loop()
        self.tap = tap           # fed the answer's bytes carried, unframed (its figures)
        self.transport: asyncio.Transport | None = None
        self.buffer = bytearray()
        self.head: asyncio.Future[_Head] = self.loop.create_future()
        self.done: asyncio.Future[None] = self.loop.create_future()
        self.parsed: _Head | None = None
        self.client: asyncio.Transport | None = None   # set once the answer is carried
        self.watch: StreamWatch | None = None
        self.left = 0            # bytes left of the chunk being read
        self.state = "size"      # size, data, crlf, trailer (chunked); raw
        self.paused = False
        self.held = False        # reads paused until the answer is carried
        self.ended = False       # the engine's connection closed
        self.framed = False      # the client's answer is chunked whatever the engine's

    # -- asyncio.Protocol ---------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # a stream transport (uvloop's is one without being asyncio.Transport's subclass)
        self.transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        if self.client is not None:
            self._carry(data)
            return
        self.buffer += data
        if self.parsed is None:
            end = self.buffer.find(b"\r\n\r\n")
            if end < 0:
                if len(self.buffer) > MAX_HEAD:
                    self._fail(EngineGone(f"an answer head over {MAX_HEAD} bytes"))
                return
            try:
                self.parsed = _parse_head(bytes(self.buffer[:end]))
            except (EngineGone, ValueError) as e:
                self._fail(e if isinstance(e, EngineGone) else EngineGone(str(e)))
                return
            del self.buffer[:end + 4]
            if not self.head.done():
                self.head.set_result(self.parsed)
        if _whole(self.parsed):
            if len(self.buffer) >= self.parsed.length:  # type: ignore[operator]
                del self.buffer[self.parsed.length:]
                self._finish()
        elif len(self.buffer) > HIGH and not self.held and self.transport is not None:
            self.held = True   # not carried yet: the engine waits
            self.transport.pause_reading()

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None
        self.ended = True
        if self.parsed is not None and self.parsed.length is None and not self.parsed.chunked:
            self._finish()   # an answer delimited by its connection's end: whole
        elif self.parsed is not None and not _whole(self.parsed) and self.client is None:
            pass   # not carried yet: what came is carried first (carry), then it ends
        else:
            self._fail(EngineGone(f"the connection closed ({exc})" if exc else
                                  "the connection closed"))

    # -- the body -----------------------------------------------------------------------

    def carry(self, client: asyncio.Transport, watch: StreamWatch) -> None:
        """From now on, each read goes to ``client`` as one chunk (what came with the
        head first)."""
        self.client, self.watch = client, watch
        assert self.parsed is not None
        self.state = "size" if self.parsed.chunked else "raw"
        if self.parsed.length is not None and not self.parsed.chunked:
            self.state, self.left = "length", self.parsed.length
        if self.buffer:
            data, self.buffer = bytes(self.buffer), bytearray()
            self._carry(data)
        if self.ended and not self.done.done():   # it closed before its answer's end
            self._fail(EngineGone("the connection closed"))
        if self.held:   # read on, unless the client's buffer paused it again
            self.held = False
            if not self.paused and self.transport is not None:
                self.transport.resume_reading()

    def _carry(self, data: bytes) -> None:
        client = self.client
        assert client is not None and self.watch is not None
        if client.is_closing():
            self._fail(ClientLeft())
            return
        self.watch.touch()
        ended = False
        begins = _one_chunk(data) if self.state == "size" and not self.buffer else 0
        if begins:
            client.write(data)   # one whole chunk, framed as the engine framed it
            if self.tap is not None:
                self.tap(data[begins:-2])
        elif self.state == "length":   # the client's answer has this length too
            payload = data[:self.left]
            self.left -= len(payload)
            client.write(b"%x\r\n%b\r\n" % (len(payload), payload) if self.framed and payload
                         else payload)
            if self.tap is not None:
                self.tap(payload)
            ended = not self.left
        else:
            if self.state == "raw":
                payload = data
            else:
                payload, ended = self._unframe(data)
            if payload:
                client.write(b"%x\r\n%b\r\n" % (len(payload), payload))
                if self.tap is not None:
                    self.tap(payload)
        if not self.paused and client.get_write_buffer_size() > HIGH \
                and self.transport is not None:
            self.paused = True
            self.transport.pause_reading()
            self.loop.call_later(RESUME_EVERY, self._resume)
        if ended:
            self._finish()

    def _unframe(self, data: bytes) -> tuple[bytes, bool]:
        """The chunks' payload in ``data`` (the framing read and dropped: sizes, CRLFs,
        trailers), and whether the last chunk was read."""
        out: list[bytes] = []
        view = self.buffer + data if self.buffer else data
        self.buffer = bytearray()
        pos, n = 0, len(view)
        while pos < n:
            if self.state == "data":
                take = min(self.left, n - pos)
                out.append(bytes(view[pos:pos + take]))
                pos += take
                self.left -= take
                if self.left == 0:
                    self.state = "crlf"
            elif self.state == "crlf":
                if n - pos < 2:
                    self.buffer = bytearray(view[pos:])
                    break
                pos += 2
                self.state = "size"
            else:   # "size" or "trailer": a line
                eol = view.find(b"\r\n", pos)
                if eol < 0:
                    if n - pos > MAX_HEAD:
                        self._fail(EngineGone("a chunk size line that does not end"))
                        return b"".join(out), False
                    self.buffer = bytearray(view[pos:])
                    break
                line = bytes(view[pos:eol])
                pos = eol + 2
                if self.state == "trailer":
                    if not line:
                        return b"".join(out), True
                    continue
                try:
                    size = int(line.split(b";", 1)[0].strip(), 16)
                except ValueError:
                    self._fail(EngineGone(f"a bad chunk size {line[:40]!r}"))
                    return b"".join(out), False
                if size == 0:
                    self.state = "trailer"
                else:
                    self.state, self.left = "data", size
        return b"".join(out), False

    def _resume(self) -> None:
        if not self.paused or self.done.done() or self.transport is None:
            return
        client = self.client
        if client is None or client.is_closing():
            self._fail(ClientLeft())
            return
        if client.get_write_buffer_size() > LOW:
            self.loop.call_later(RESUME_EVERY, self._resume)
            return
        self.paused = False
        self.transport.resume_reading()

    def _finish(self) -> None:
        if not self.done.done():
            self.done.set_result(None)
        self.close()

    def _fail(self, e: BaseException) -> None:
        if not self.head.done():
            self.head.set_exception(e)
            self.head.exception()   # retrieved: whoever awaits it reads it again
        if not self.done.done():
            self.done.set_exception(e)
            self.done.exception()
        self.close()

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()

    def set_exception(self, e: BaseException) -> None:
        """The stream's watch: the engine was silent past its patience."""
        self._fail(e)


def request_head(method: str, path_qs: str, host: str, headers: Mapping[str, str],
                 length: int) -> bytes:
    """The request's head for the engine, with its body's length and ``Connection: close``;
    a client's ``Expect: 100-continue`` stays here (the gateway has its body already, and
    an interim 100 would be read as the answer's head)."""
    lines = [f"{method} {path_qs} HTTP/1.1", f"Host: {host}"]
    lines += [f"{k}: {v}" for k, v in headers.items()
              if k.lower() not in ("host", "content-length", "connection", "transfer-encoding",
                                   "expect")]
    lines += [f"Content-Length: {length}", "Connection: close", "", ""]
    # the client's bytes again: aiohttp read its head as UTF-8 with surrogateescape
    return "\r\n".join(lines).encode("utf-8", "surrogateescape")


async def carry(request: web.Request, host: str, port: int, authority: str, path_qs: str,
                body: bytes,
                headers: Mapping[str, str], hop_by_hop: frozenset[str], patience: Patience,
                side: str, route: Route | None = None,
                tap: Callable[[bytes], None] | None = None,
                told: web.StreamResponse | None = None) -> web.StreamResponse:
    """The answer of the engine (or peer gateway) at ``host``:``port`` to ``request`` sent
    to ``path_qs`` (its ``body`` read already, ``headers`` the forwarded ones), its stream
    carried as bytes; ``route``: this host's engines at their socket
    (:mod:`lokid.gateway.sockets`); ``tap``: fed each part of a carried answer, unframed
    (:class:`lokid.gateway.figures.Tail`). OSError when no connection was made (the caller's
    502); EngineSilent or EngineGone before the answer's head; ClientLeft once the client
    went away mid-answer; ``told``: the response whose head went out already (see the
    module's opening), Refused for an answer other than 200 then."""
    engine = _Engine(tap)
    transport, _ = await open_engine(lambda: engine, host, port, route, CONNECT_TIMEOUT)
    try:
        transport.write(request_head(request.method, path_qs, authority, headers, len(body))
                        + body)
        heading = HeadWatch(engine, patience, side)
        try:
            head = await engine.head   # awaited as it is: see HeadWatch
        finally:
            heading.close()
        answer_headers = CIMultiDict((k, v) for k, v in head.headers.items()
                                     if k.lower() not in hop_by_hop)
        if _whole(head):
            await within(asyncio.shield(engine.done), patience, side)
            if told is not None:
                if head.status != 200:
                    raise Refused(head.status, bytes(engine.buffer))
                await told.write(bytes(engine.buffer))
                await told.write_eof()
                return told
            return web.Response(status=head.status, reason=head.reason or None,
                                body=bytes(engine.buffer), headers=answer_headers)
        if told is not None:
            if head.status != 200:
                raise Refused(head.status, b"")
            response = told
            engine.framed = True
        else:
            response = web.StreamResponse(status=head.status, reason=head.reason or None,
                                          headers=answer_headers)
            if head.length is not None and not head.chunked:
                response.content_length = head.length   # carried as it is, unframed
            await response.prepare(request)
            await response.write(b"")   # the head on its way (aiohttp may hold it for a body)
        client = request.transport
        if client is None or client.is_closing():
            raise ClientLeft()
        watch = StreamWatch(engine, patience, side)
        try:
            engine.carry(client, watch)
            failure: BaseException | None = None
            try:
                await engine.done
            except (EngineGone, EngineSilent, ClientLeft) as e:
                failure = e
        finally:
            watch.close()
        if failure is None:
            await response.write_eof()
            return response
        raise Failed(response, failure, head.headers.get("Content-Type", ""))
    finally:
        engine.close()


class Failed(Exception):
    """An answer under way that did not end: its response, why, its content type."""

    def __init__(self, response: web.StreamResponse, cause: BaseException, content_type: str):
        super().__init__(str(cause))
        self.response, self.cause, self.content_type = response, cause, content_type
