"""A request's body read by the gateway: bounded in size once inflated, and in time.

Rules, each for a failure it prevents (issue 28, items 9 to 11):

- aiohttp's own inflation is off (``auto_decompress=False``, :func:`lokid.gateway.server
  .runner_kwargs`): it inflated each chunk whole, so 64 KB of gzip became 63 MiB in one
  call before any bound was checked. Here ``gzip`` and ``deflate`` bodies are inflated
  at most ``max_body + 1`` bytes at a time (``zlib``'s ``max_length``): ``max_body``
  bounds the inflated size, and inflating stops at it (413);
- the body relayed is the inflated one, sent without ``Content-Encoding`` (an engine
  sent the inflated bytes still marked gzip answered 415); an encoding the gateway does
  not inflate is 415, a gzip body that does not inflate is 400, never a 500;
- a body has a deadline: :data:`GRACE` seconds, plus one second for each
  :data:`MIN_RATE` bytes received. A client that trickles a byte every five seconds is
  answered 408 after the grace, its connection closed (200 such bodies were all open
  after 100 s); a slow but honest upload (a 10 MB image at 100 KB/s) always keeps
  ahead of it;
- what the gateway holds of all bodies together is bounded (issue 45, item 8: eight
  64 KiB gzip bombs at once took it to 299 MiB): :class:`Bodies` counts the bytes each
  request has read (inflated) until its answer ends, at most :data:`BODIES_HELD` ×
  ``max_body``. A body that would pass it is answered 503 ``server_busy`` (try again)
  and what it read is let go: the gateway's memory, under the unit's ``MemoryMax=``,
  holds however many clients send big bodies at once. One ``max_body`` always fits.
  Measured (the real gateway process, eight 64 KiB bombs of 63 MiB each sent at once
  in 4 KiB pieces, default ``max_body``): VmHWM 44 → 615 MiB before; now 45 → 49 MiB
  on an inference route (the preset's bound, :mod:`lokid.gateway.prompts`) and 45 →
  240 MiB on a batch route (two bodies held, one more being joined, the rest 503);
- how much of a body is read is the caller's ``limit`` (``max_body``, or less where the
  presets take less, :func:`lokid.gateway.prompts.read_limit`), and its 413 says which
  bound it is (``why``).
"""

from __future__ import annotations

import asyncio
import zlib
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from .replies import UNAVAILABLE, GatewayError

GRACE = 30.0          # seconds any body has, as a request's head (lokid.gateway.headtimeout)
MIN_RATE = 8 * 1024   # bytes a second a body must average beyond the grace
INFLATED = ("gzip", "x-gzip", "deflate")
BODIES_HELD = 2       # max_body's worth of bodies the gateway holds at once, at most
# a request's bytes held in Bodies (RequestKey from aiohttp 3.12; a string before)
HELD_KEY: Any = web.RequestKey("lokid_body_held", int) if hasattr(web, "RequestKey") \
    else "lokid_body_held"
MAX_BODY_TEXT = "the gateway's max_body"

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class Bodies:
    """The bytes of every body read and not yet let go, at most ``total``: each request's
    share is let go when its answer ends (:meth:`middleware`)."""

    def __init__(self, total: int):
        self.total = total
        self.held = 0

    def take(self, request: web.Request, size: int) -> None:
        """``size`` more bytes of ``request``'s body held; GatewayError 503 past the bound."""
        if self.held + size > self.total:
            raise GatewayError(503, "the gateway holds as much of other requests' bodies as "
                               f"it may ({self.total // (1024 * 1024)} MiB, {BODIES_HELD} "
                               "times its max_body): try again in a moment", UNAVAILABLE,
                               "server_busy")
        self.held += size
        request[HELD_KEY] = request.get(HELD_KEY, 0) + size

    @web.middleware
    async def middleware(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        try:
            return await handler(request)
        finally:
            self.held -= request.get(HELD_KEY, 0)
            request[HELD_KEY] = 0


class SlowBody(GatewayError):
    """A body that did not come in time: 408, and the connection is closed."""

    def __init__(self, received: int, seconds: float):
        super().__init__(408, f"the request body did not arrive in time ({received} bytes in "
                         f"{seconds:.0f} s; a body has {GRACE:g} s, then must average "
                         f"{MIN_RATE // 1024} KiB/s)", code="request_timeout")


def _too_big(limit: int, why: str) -> GatewayError:
    return GatewayError(413, f"the request body is over {why} ({limit} bytes, inflated)",
                        code="request_too_large")


def _inflater(request: web.Request) -> zlib._Decompress | None:
    encoding = request.headers.get("Content-Encoding", "").strip().lower()
    if encoding in ("", "identity"):
        return None
    if encoding in INFLATED:
        # 32 + MAX_WBITS: a gzip or a zlib header, read from the data (what "deflate"
        # means in HTTP is zlib's format)
        return zlib.decompressobj(32 + zlib.MAX_WBITS)
    raise GatewayError(415, f"the gateway does not inflate a body in {encoding[:32]!r}: send it "
                       "plain, gzip or deflate", code="unsupported_encoding")


async def read_body(request: web.Request, limit: int, bodies: Bodies | None = None,
                    why: str = MAX_BODY_TEXT) -> bytes:
    """The request's body, inflated, held in ``bodies``; GatewayError 413 (over ``limit``,
    which ``why`` names), 415, 400, 503 (``bodies`` full) or :class:`SlowBody`."""
    grace, min_rate = GRACE, MIN_RATE
    inflater = _inflater(request)
    if request.content_length is not None and request.content_length > limit:
        raise _too_big(limit, why)
    loop = asyncio.get_running_loop()
    start = loop.time()
    parts: list[bytes] = []
    size = received = 0
    content = request.content
    while True:
        # what came already is taken at once: a wait_for's task (Python 3.11) cost turns
        # of the event loop at each read, each behind every other request's steps (issue
        # 47: the body's read took 2.6-4.4 ms p50 of 16 simultaneous streams, now 0.05)
        chunk = content.read_nowait()
        if not chunk and not content.at_eof():
            left = start + grace + received / min_rate - loop.time()
            try:
                if left <= 0:
                    raise TimeoutError
                chunk = await asyncio.wait_for(content.readany(), left)
            except TimeoutError:
                raise SlowBody(received, loop.time() - start) from None
        if not chunk:
            break
        received += len(chunk)
        if inflater is None:
            size += len(chunk)
            if size > limit:
                raise _too_big(limit, why)
            if bodies is not None:
                bodies.take(request, len(chunk))
            parts.append(chunk)
            continue
        data = chunk
        while data:
            try:
                out = inflater.decompress(data, limit - size + 1)
            except zlib.error as e:
                raise GatewayError(400, f"the request body does not inflate ({e})",
                                   code="invalid_encoding") from None
            size += len(out)
            if size > limit:
                raise _too_big(limit, why)
            if bodies is not None:
                bodies.take(request, len(out))
            parts.append(out)
            data = inflater.unconsumed_tail
    if inflater is not None and received:
        if not inflater.eof:
            raise GatewayError(400, "the request body's compressed data ends too early",
                               code="invalid_encoding")
        if inflater.unused_data.strip():
            raise GatewayError(400, "the request body holds data after its compressed "
                               "stream", code="invalid_encoding")
    return b"".join(parts)
