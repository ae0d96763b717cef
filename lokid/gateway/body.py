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
  ahead of it.
"""

from __future__ import annotations

import asyncio
import zlib

from aiohttp import web

from .replies import GatewayError

GRACE = 30.0          # seconds any body has, as a request's head (lokid.gateway.headtimeout)
MIN_RATE = 8 * 1024   # bytes a second a body must average beyond the grace
INFLATED = ("gzip", "x-gzip", "deflate")


class SlowBody(GatewayError):
    """A body that did not come in time: 408, and the connection is closed."""

    def __init__(self, received: int, seconds: float):
        super().__init__(408, f"the request body did not arrive in time ({received} bytes in "
                         f"{seconds:.0f} s; a body has {GRACE:g} s, then must average "
                         f"{MIN_RATE // 1024} KiB/s)", code="request_timeout")


def _too_big(limit: int) -> GatewayError:
    return GatewayError(413, f"the request body is over the gateway's max_body ({limit} "
                        "bytes, inflated)", code="request_too_large")


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


async def read_body(request: web.Request, limit: int) -> bytes:
    """The request's body, inflated; GatewayError 413, 415, 400 or :class:`SlowBody`."""
    grace, min_rate = GRACE, MIN_RATE
    inflater = _inflater(request)
    if request.content_length is not None and request.content_length > limit:
        raise _too_big(limit)
    loop = asyncio.get_running_loop()
    start = loop.time()
    parts: list[bytes] = []
    size = received = 0
    while True:
        left = start + grace + received / min_rate - loop.time()
        try:
            if left <= 0:
                raise TimeoutError
            chunk = await asyncio.wait_for(request.content.readany(), left)
        except TimeoutError:
            raise SlowBody(received, loop.time() - start) from None
        if not chunk:
            break
        received += len(chunk)
        if inflater is None:
            size += len(chunk)
            if size > limit:
                raise _too_big(limit)
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
                raise _too_big(limit)
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
