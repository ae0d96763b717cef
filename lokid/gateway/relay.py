"""One request carried to an engine and its answer carried back, with aiohttp's client;
a request that asks one of this host's engines to stream, by :mod:`lokid.gateway.tunnel`
(its answer carried as bytes, the rules below kept).

aiohttp's client, not httpx: measured here against the real engine, one keep-alive
request at a time, it answered in 0.26-0.31 ms p50 where httpx took 0.69-0.79 ms,
and the gateway's whole cost is held to 1 ms.

Rules, each for a failure it prevents:

- bytes pass as they are (no decompression, no re-encoding of the JSON), and an answer
  that streams (server-sent events, or no length) is written on chunk by chunk as it
  comes: a client sees each token when the engine sends it;
- the engine's connection that carried a stream is closed, never pooled: the engine
  closes it itself, and a request handed it meanwhile would fail; a request whose pooled
  connection was closed before it was sent goes once more on a new one (:data:`STALE`);
- a client that goes away ends the upstream request: leaving the ``async with`` closes
  the engine's connection unread, and the engine frees the slot; it is no error of
  the gateway's (no traceback), counted 499 (:class:`ClientGone`);
- an engine's silence is bounded, and a hung one told apart from a slow one by its
  ``/health`` (:mod:`lokid.gateway.silence`): 504 before the answer's head, a last
  error event mid-stream;
- a client is not told the other side's address (502 and 504 name the preset's engine
  or API; the address is in the gateway's log);
- an engine that dies mid-answer ends the client's answer too, never a hang: a stream
  of events gets a last event holding the error; any other answer is cut off (the
  connection closed before its end), which a client reads as an error;
- hop-by-hop headers stay on their hop; no header that may carry a client's key
  (:data:`lokid.core.serve.keys.CLIENT_KEY_HEADERS`: ``Authorization``, ``x-api-key``,
  ``api-key``, ``Proxy-Authorization``) leaves the gateway, to an engine, an external API
  or a peer gateway, keyed gateway or not: a preset with its own key gets that one
  (:mod:`lokid.gateway.upstream`), a peer the peer key. Only ``Authorization`` was dropped
  before, and a keyed gateway's own client key sent as ``x-api-key`` reached an external
  preset's API and a peer gateway (issue 46). A keyless gateway no longer hands its
  engines the client's ``Authorization`` either: an engine keyed with ``--api-key``
  typed in its command line, which the gateway cannot know, is reached by giving the
  preset ``api_key_file`` (what lokid sends it then), not by clients sending its key;
- what is relayed costs a bounded buffer, whatever its size and however slowly the
  client reads (issue 45, item 2: a 600 MiB answer was read whole, and under
  ``MemoryMax=1G`` systemd would have killed the gateway with every stream through it):
  an answer over :data:`WHOLE` bytes, or of no stated length, is written on as it comes,
  each write awaiting the client's drain (aiohttp's), which leaves the other side's
  bytes unread meanwhile; an external API's answer whose model is renamed is rewritten
  as it passes (:class:`Renamer` keeps a few bytes back, never a line or the whole);
  what the gateway itself reads to parse (``/props``) is refused beyond its cap
  (``whole``: 502);
- a request to a peer gateway goes on a connection of its own, never a pooled one, and
  only a connect that failed lets it go to another replica (:class:`Unreached`): once
  its bytes were written the peer may have read them all, and a second replica would
  generate the answer twice (issue 45, item 4: a peer that read the request and closed
  2 s later had it sent on). A pooled connection closed meanwhile cannot be told from
  a peer that read the request and then closed, so none is used. To one of several
  replicas on this host, a connection closed before the answer's head also lets it go
  to another, once, when the engine is then found gone (:mod:`.enginegone`).
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Mapping
from typing import Any

import aiohttp
from aiohttp import web
from yarl import URL

from ..core.serve.keys import CLIENT_KEY_HEADERS
from . import tunnel
from .enginegone import engine_gone
from .figures import tail_of
from .replies import SERVER, GatewayError, sse_error
from .report import STATUS_KEY
from .silence import EngineSilent, Patience, StreamWatch, within
from .sockets import EngineConnector, Route

log = logging.getLogger("lokid.gateway")

HOP_BY_HOP = frozenset({"connection", "keep-alive", "proxy-authenticate", "proxy-authorization",
                        "te", "trailer", "trailers", "transfer-encoding", "upgrade", "host",
                        "content-length"})
# Failures of the engine's side of a request (aiohttp's client errors).
UPSTREAM_ERRORS = (aiohttp.ClientError, OSError)
# The connection closed before any answer: llama-server closes a kept-alive connection
# after a stream (and after its keep-alive timeout), a moment after the last byte, and the
# pool may hand it out in that moment. To one of our engines the request is sent once more,
# on a new connection: it did not reach the engine, or reached one that went away before
# answering (a request to an engine changes nothing to repeat). Never to an external API
# (a second request may cost twice), nor for a refused connect: those are answered 502.
STALE = (aiohttp.ServerDisconnectedError, aiohttp.ClientOSError)
# Seconds a connection rests in a pool before it is closed rather than used: below the
# other side's own keep-alive, so that the pool never hands out one it is closing.
# llama-server (cpp-httplib) closes an idle one after 5 s, as uvicorn does; gunicorn after
# 2 s. An external API's request is never sent twice (it may cost twice), so its pool
# keeps its connections shorter than any of them: 1 in 300-500 requests failed with
# "Server disconnected" when they rested 15 s (aiohttp's default).
LOCAL_KEEPALIVE = 4.0
EXTERNAL_KEEPALIVE = 1.5
# Bytes of an answer with a stated length read whole before it is answered (an error, a
# refusal, a short completion: one write, the length kept); a longer one, or one of no
# stated length, is written on as it comes.
WHOLE = 1024 * 1024


def session(keepalive: float = LOCAL_KEEPALIVE, route: Route | None = None,
            fresh: bool = False) -> aiohttp.ClientSession:
    """A pool of connections (kept alive ``keepalive`` seconds at most between requests);
    with ``route``, this host's engines are reached at their socket where they have one
    (:mod:`lokid.gateway.sockets`); ``fresh``: no connection is ever reused (a peer
    gateway's requests: only a failed connect may go to another replica)."""
    pool: dict[str, Any] = {"limit": 0, "force_close": True} if fresh else \
        {"limit": 0, "force_close": False, "keepalive_timeout": keepalive}
    connector = EngineConnector(route, **pool) if route is not None else \
        aiohttp.TCPConnector(**pool)
    return aiohttp.ClientSession(
        connector=connector,
        timeout=aiohttp.ClientTimeout(total=None, sock_connect=10),
        auto_decompress=False, skip_auto_headers=("User-Agent", "Accept-Encoding"))


def forwarded(headers: Mapping[str, str], local: bool = True) -> dict[str, str]:
    """The client's headers for the other side: no hop-by-hop one, no Content-Encoding
    (the body sent is the inflated one, :mod:`lokid.gateway.body`), none that may carry
    a client's key (CLIENT_KEY_HEADERS); to an external API no Accept-Encoding either (its
    answer is read to name the model as the preset, :class:`Renamer`)."""
    out = {}
    for key, value in headers.items():
        low = key.lower()
        if low in HOP_BY_HOP or low == "content-encoding" or low in CLIENT_KEY_HEADERS or (
                low == "accept-encoding" and not local):
            continue
        out[key] = value
    return out


class Renamer:
    """An external API's answer naming the preset, not the API's model: each
    ``"model": "<upstream_model>"`` (up to :data:`SPACES` blanks each side of the colon)
    becomes ``"model": "<preset>"`` (the API's JSON, as it wrote it otherwise). An answer
    that comes in parts is rewritten as it passes: of each part, the bytes where a match
    could still begin and not end yet (:attr:`keep`, a few dozen) wait for the next one;
    never a line or the whole answer (a 600 MiB answer on one line held the gateway's
    memory, issue 45, item 2)."""

    SPACES = 16

    def __init__(self, upstream_model: str, preset: str):
        name = json.dumps(upstream_model)[1:-1].encode()
        space = rb"\s{0,%d}" % self.SPACES
        self.pattern = re.compile(rb'("model"' + space + b":" + space + b')"'
                                  + re.escape(name) + rb'"')
        self.replacement = rb"\1" + json.dumps(preset).encode().replace(b"\\", b"\\\\")
        self.keep = len(b'"model":') + 2 * self.SPACES + len(name) + 2   # a match, at most
        self.rest = b""

    def whole(self, data: bytes) -> bytes:
        return self.pattern.sub(self.replacement, data)

    def chunk(self, data: bytes) -> bytes:
        data = self.rest + data
        cut, pos = max(0, len(data) - self.keep), 0
        out: list[bytes] = []
        for m in self.pattern.finditer(data):
            if m.start() >= cut:   # it may go on in the next part: it waits
                break
            out += (data[pos:m.start()], m.expand(self.replacement))
            pos = m.end()
        cut = max(cut, pos)
        out.append(data[pos:cut])
        self.rest = data[cut:]
        return b"".join(out)

    def end(self) -> bytes:
        rest, self.rest = self.rest, b""
        return self.whole(rest)


def _streams(answer: aiohttp.ClientResponse) -> bool:
    """Whether an answer streams (events, or no length): relayed chunk by chunk."""
    return answer.content_type == "text/event-stream" or answer.content_length is None


def _gone(request: web.Request) -> bool:
    return request.transport is None or request.transport.is_closing()


async def relay(client: aiohttp.ClientSession, request: web.Request, url: str, body: bytes,
                keep_auth: bool, patience: Patience, *, key: str | None = None,
                target: str = "", what: str = "", renamer: Renamer | None = None,
                hop: str = "", stream: bool = False, whole: int = 0,
                told: web.StreamResponse | None = None, elsewhere: bool = False
                ) -> web.StreamResponse:
    """Send ``request`` (its ``body`` read already) to the engine at ``url``, answer with
    what it answers. ``keep_auth``: no longer used (no client key leaves the gateway,
    whatever a caller asks); ``key``: the preset's own, the only key sent; ``target``:
    the URL when it is not ``url`` and the client's path (an external preset's);
    ``what``: how errors name the other side (to the client: no address of it);
    ``patience``: how long its silence is borne (:mod:`lokid.gateway.silence`);
    ``renamer``: an external API's model named as the preset in its answer; ``hop``: the
    header that marks a request sent to a peer gateway (:mod:`lokid.gateway.peers`),
    which then fails with :class:`Unreached` when none of it reached the peer (its
    connect failed: ``client`` must then be a ``fresh`` :func:`session`);
    ``stream``: the request asks to stream: to one of our engines, its answer is carried
    as bytes (:mod:`lokid.gateway.tunnel`); ``whole``: the answer is read whole, up to
    that many bytes (a :class:`aiohttp.web.Response`, for the gateway to read; 502
    beyond), never written on as it comes; ``told``: the client's answer whose head the
    gateway sent already while it waited (:mod:`lokid.gateway.waitnotes`), a stream to one
    of our engines, whose events are carried into it; ``elsewhere``: another engine of
    the preset may take it (its replicas, issue 47): a connection to this one never made
    fails with :class:`Unreached` too, and so does one closed before its answer's head
    when the engine is then found gone (:mod:`lokid.gateway.enginegone`; ``sent``)."""
    local = not target   # one of our engines, not an API elsewhere
    target = target or url + request.path_qs
    headers = forwarded(request.headers, local)
    if key is not None:   # forwarded() dropped the client's
        headers["Authorization"] = f"Bearer {key}"
    if hop:
        headers[hop] = "1"
    side = what or "the engine"
    if stream and not whole and (local or hop) and renamer is None \
            and request.version >= (1, 1):
        other = URL(target)   # an engine of ours, or a peer gateway: plain HTTP only
        if other.scheme == "http" and other.host and other.port:
            connector = client.connector
            route = connector.route if local and isinstance(connector, EngineConnector) \
                else None
            return await _tunnelled(request, other, body, headers, patience, side, url,
                                    bool(hop) or elsewhere, route, told, elsewhere)
    if told is not None:   # not carried as bytes (lokid.gateway.waitnotes tells no other)
        raise GatewayError(502, f"{side} could not be reached as a stream", SERVER,
                           "upstream_unreachable")

    async def send() -> aiohttp.ClientResponse:
        answer = await client.request(request.method, target, data=body or None,
                                      headers=headers, allow_redirects=False)
        if _streams(answer) and answer.connection is not None \
                and answer.connection.protocol is not None:
            # llama-server closes its side after a stream: not pooled, it is handed to no
            # other request. Here, in the step its head arrived: a short stream may be
            # whole already, and aiohttp gives the connection back to the pool before
            # any other task runs
            answer.connection.protocol.force_close()
        return answer

    for attempt in range(2):
        try:
            upstream = await within(send(), patience, side)
            break
        except EngineSilent as e:
            raise GatewayError(504, str(e), SERVER, "upstream_timeout") from None
        except STALE as e:
            if hop:   # on a new connection: only a failed connect sent it nowhere
                if isinstance(e, aiohttp.ClientConnectorError):
                    raise Unreached(side, url, e) from None
                raise _unreachable(side, url, e, "after it was sent") from None
            if elsewhere and isinstance(e, aiohttp.ClientConnectorError):
                # a replica killed: another (sent once already, when a first try was)
                raise Unreached(side, url, e, sent=attempt > 0) from None
            if attempt == 0 and local and not isinstance(e, aiohttp.ClientConnectorError):
                # a pooled connection the engine closed meanwhile: a new one
                log.debug("%s closed a kept-alive connection: %s; once more", side, e)
                continue
            if elsewhere and await _engine_gone(client, URL(url)):
                raise Unreached(side, url, e, sent=True) from None
            raise _unreachable(side, url, e) from None
        except UPSTREAM_ERRORS as e:
            if hop and isinstance(e, aiohttp.ServerTimeoutError):   # its connect timed out
                raise Unreached(side, url, e) from None
            raise _unreachable(side, url, e) from None
    async with upstream:
        headers = {k: v for k, v in upstream.headers.items() if k.lower() not in HOP_BY_HOP}
        if renamer is not None and "content-encoding" in {k.lower() for k in headers}:
            renamer = None   # compressed: not read
        length = None if _streams(upstream) else upstream.content_length
        if whole or (length is not None and length <= WHOLE):
            if whole and (length or 0) > whole:
                raise _too_long(side, url, length, whole)
            try:
                data = await within(read_capped(upstream, whole or WHOLE), patience, side)
            except EngineSilent as e:
                raise GatewayError(504, str(e), SERVER, "upstream_timeout") from None
            except UPSTREAM_ERRORS as e:
                log.warning("%s at %s failed while answering: %s", side, url,
                            e or type(e).__name__)
                raise GatewayError(502, f"{side} failed while answering: "
                                   f"{type(e).__name__}", SERVER, "upstream_failed") from None
            if data is None:
                raise _too_long(side, url, None, whole or WHOLE)
            if renamer is not None:
                data = renamer.whole(data)
            return web.Response(status=upstream.status, body=data, headers=headers)
        response = web.StreamResponse(status=upstream.status, headers=headers)
        if renamer is None and length is not None:
            response.content_length = length   # its bytes pass as they are
        watch = StreamWatch(upstream.content, patience, side)
        tail = tail_of(request)   # the engine's figures, at its end (lokid.gateway.usage)
        try:
            await response.prepare(request)
            async for chunk in upstream.content.iter_any():
                watch.touch()
                tail.feed(chunk)
                await response.write(renamer.chunk(chunk) if renamer else chunk)
            if renamer is not None:
                await response.write(renamer.end())
            await response.write_eof()
        except (aiohttp.ClientPayloadError, aiohttp.ServerDisconnectedError,
                aiohttp.ClientOSError, EngineSilent) as e:
            if isinstance(e, ConnectionResetError) or _gone(request):
                raise ClientGone(response) from None   # the client went away: nothing to tell it
            await _end_failed(request, response, e, upstream.content_type == "text/event-stream",
                              side, url)
        except ConnectionResetError:
            raise ClientGone(response) from None   # a write to a client that went away
        finally:
            watch.close()
        return response


async def _tunnelled(request: web.Request, other: URL, body: bytes, headers: Mapping[str, str],
                     patience: Patience, side: str, url: str, hop: bool, route: Route | None,
                     told: web.StreamResponse | None = None, elsewhere: bool = False
                     ) -> web.StreamResponse:
    """:func:`lokid.gateway.tunnel.carry`, its failures told as the relay tells them; to a
    peer gateway or to one of several replicas (``hop``), a connection never made is
    :class:`Unreached` (nothing of the
    request reached it: another replica may take it), anything later is not."""
    assert other.host is not None and other.port is not None
    try:
        return await tunnel.carry(request, other.host, other.port, other.raw_authority,
                                  other.raw_path_qs, body, headers, HOP_BY_HOP, patience, side,
                                  route, tail_of(request).feed, told)
    except tunnel.Refused as e:   # after the gateway's head: its error as the last event
        assert told is not None
        request[STATUS_KEY] = e.status   # counted as the engine answered
        log.info("%s answered %d to a request told it waited", side, e.status)
        try:
            await told.write(_error_event(e.body, f"{side} answered {e.status}"))
            await told.write_eof()
        except ConnectionResetError:
            raise ClientGone(told) from None
        return told
    except EngineSilent as e:
        raise GatewayError(504, str(e), SERVER, "upstream_timeout") from None
    except OSError as e:   # no connection (refused, or its connect timed out)
        if hop:
            raise Unreached(side, url, e) from None
        raise _unreachable(side, url, e) from None
    except tunnel.EngineGone as e:   # it closed before its answer's head
        if elsewhere and await engine_gone(other.host, other.port,
                                           route(other.host, other.port) if route else ""):
            raise Unreached(side, url, e, sent=True) from None
        raise _unreachable(side, url, e) from None
    except tunnel.ClientLeft:
        raise ClientGone(web.StreamResponse()) from None
    except tunnel.Failed as e:
        if isinstance(e.cause, tunnel.ClientLeft) or _gone(request):
            raise ClientGone(e.response) from None
        await _end_failed(request, e.response, e.cause,
                          e.content_type.startswith("text/event-stream"), side, url)
        return e.response


async def _end_failed(request: web.Request, response: web.StreamResponse, e: BaseException,
                      events: bool, side: str, url: str) -> None:
    """An answer under way whose engine failed (``e``): a stream of ``events`` gets a last
    one holding the error; any other answer is cut off (its connection closed before its
    end), which a client reads as an error."""
    log.warning("%s at %s failed mid-answer: %s", side, url, e or type(e).__name__)
    if not events:
        assert request.transport is not None
        request.transport.close()
        return
    reason = str(e) if isinstance(e, EngineSilent) else \
        f"{side} failed mid-answer: {type(e).__name__}"
    try:
        await response.write(sse_error(reason))
        await response.write_eof()
    except ConnectionResetError:
        raise ClientGone(response) from None


def _error_event(body: bytes, otherwise: str) -> bytes:
    """An engine's error answer as one server-sent event: its own JSON error object where
    it is one, else ``otherwise`` in OpenAI's shape."""
    try:
        data = json.loads(body) if body else None
    except ValueError:
        data = None
    if isinstance(data, dict) and isinstance(data.get("error"), dict):
        return b"data: " + json.dumps(data, separators=(",", ":")).encode() + b"\n\n"
    return sse_error(otherwise)


def _unreachable(side: str, url: str, e: BaseException, when: str = "") -> GatewayError:
    """502 for an engine or API that did not answer (``when``: said after "did not
    answer"): its address for the log only."""
    when = f" {when}" if when else ""
    log.info("%s at %s did not answer%s: %s", side, url, when, e or type(e).__name__)
    return GatewayError(502, f"{side} did not answer{when} ({type(e).__name__})", SERVER,
                        "upstream_unreachable")


async def read_capped(answer: aiohttp.ClientResponse, cap: int) -> bytes | None:
    """The answer's body, or None past ``cap`` bytes (what was read is dropped)."""
    data = bytearray()
    async for chunk in answer.content.iter_any():
        data += chunk
        if len(data) > cap:
            return None
    return bytes(data)


def _too_long(side: str, url: str, length: int | None, cap: int) -> GatewayError:
    """502 for an answer the gateway must read whole and that is over its ``cap``."""
    said = f" ({length} bytes)" if length is not None else ""
    log.warning("%s at %s answered over %d bytes%s: refused", side, url, cap, said)
    return GatewayError(502, f"{side} answered over {cap // 1024} KiB, more than the "
                        "gateway reads", SERVER, "upstream_too_large")


class Unreached(GatewayError):
    """A request none of which reached a peer gateway or an engine (its connect failed):
    it may go to another replica (lokid.gateway.peers, lokid.gateway.replicas)."""

    def __init__(self, side: str, url: str, e: BaseException, sent: bool = False):
        log.info("%s at %s did not answer%s: %s", side, url, " and is gone" if sent else "",
                 e or type(e).__name__)
        super().__init__(502, f"{side} did not answer ({type(e).__name__})", SERVER,
                         "upstream_unreachable")
        self.cause = e
        self.sent = sent   # its bytes were sent, to an engine found gone since


async def _engine_gone(client: aiohttp.ClientSession, url: URL) -> bool:
    """:func:`~.enginegone.engine_gone` for the engine at ``url`` as ``client`` reaches it."""
    connector = client.connector
    path = connector.route(url.host, url.port) \
        if isinstance(connector, EngineConnector) and url.host and url.port else ""
    return await engine_gone(url.host, url.port, path or "")


class ClientGone(Exception):
    """The client went away mid-answer: nothing to answer, counted as 499. ``response``:
    its answer, already under way (aiohttp ends it quietly)."""

    def __init__(self, response: web.StreamResponse):
        super().__init__("the client went away")
        self.response = response
