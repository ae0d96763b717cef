"""lokid.gateway.tunnel: a streamed answer carried as bytes, over real sockets.

A stand-in engine (an aiohttp app on loopback: it streams in chunks, dies inside a chunk,
refuses with a length, streams more than a client reads) and a front (an aiohttp app whose
handler is the gateway's :func:`lokid.gateway.relay.relay`); the client is aiohttp's. The
real engine's streams through the whole gateway are tests/gateway/test_relay.py's.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from support.gatewaykit import LOOPS, app_on_loopback, loop_policy

from lokid.gateway import relay as relay_module
from lokid.gateway import tunnel
from lokid.gateway.relay import ClientGone, relay, session
from lokid.gateway.silence import Patience


@pytest.fixture(params=LOOPS)
def event_loop_policy(request: pytest.FixtureRequest) -> asyncio.AbstractEventLoopPolicy:
    """Each test on both loops the gateway runs on (lokid.gateway.server.run): uvloop's
    transports are no subclasses of asyncio's."""
    return loop_policy(request.param)


EVENTS = [f'data: {{"i": {i}, "text": "{"x" * (i % 7)}"}}\n\n'.encode() for i in range(40)]


class Engine:
    """The stand-in engine and what it saw."""

    def __init__(self) -> None:
        self.gone = asyncio.Event()   # a client of a long stream went away
        self.written = 0              # bytes of the big stream written so far

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_post("/stream", self.stream)
        app.router.add_post("/die", self.die)
        app.router.add_post("/refuse", self.refuse)
        app.router.add_post("/big", self.big)
        app.router.add_post("/long", self.long)
        return app

    async def stream(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        r = web.StreamResponse(headers={"Content-Type": "text/event-stream",
                                        "X-Seen-Connection": request.headers.get("Connection",
                                                                                 ""),
                                        "X-Seen-Note": request.headers.get("X-Note", "")})
        r.enable_chunked_encoding()
        await r.prepare(request)
        for event in EVENTS[:body.get("n", len(EVENTS))]:
            await r.write(event)
            await asyncio.sleep(0)
        await r.write_eof()
        return r

    async def die(self, request: web.Request) -> web.StreamResponse:
        await request.read()
        r = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        r.enable_chunked_encoding()
        await r.prepare(request)
        await r.write(EVENTS[0])
        await asyncio.sleep(0.05)
        assert request.transport is not None
        request.transport.write(b"400\r\ndata: {\"half")   # a chunk that never ends
        await asyncio.sleep(0.05)
        request.transport.abort()
        return r

    async def refuse(self, request: web.Request) -> web.Response:
        await request.read()
        return web.json_response({"error": {"message": "no", "type": "invalid"}}, status=400)

    async def big(self, request: web.Request) -> web.StreamResponse:
        await request.read()
        r = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        r.enable_chunked_encoding()
        await r.prepare(request)
        event = b"data: " + b"y" * 65_000 + b"\n\n"
        try:
            for _ in range(600):        # ~39 MB, far more than a paused client takes
                await r.write(event)
                self.written += len(event)
            await r.write_eof()
        except ConnectionError:
            self.gone.set()
        return r

    async def long(self, request: web.Request) -> web.StreamResponse:
        await request.read()
        r = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        r.enable_chunked_encoding()
        await r.prepare(request)
        try:
            for _ in range(3000):
                await r.write(EVENTS[1])
                await asyncio.sleep(0.01)
        except ConnectionError:
            self.gone.set()
        return r


@pytest.fixture
async def engine() -> AsyncIterator[tuple[Engine, str]]:
    stand_in = Engine()
    async with app_on_loopback(stand_in.app()) as url:
        yield stand_in, url


@pytest.fixture
async def front(engine: tuple[Engine, str], monkeypatch: pytest.MonkeyPatch
                ) -> AsyncIterator[tuple[str, list[str]]]:
    """The gateway's relay as a front's handler; the paths the tunnel carried."""
    carried: list[str] = []
    real = tunnel.carry

    async def spy(request: web.Request, *args: Any, **kwargs: Any) -> web.StreamResponse:
        carried.append(request.path)
        return await real(request, *args, **kwargs)
    monkeypatch.setattr(relay_module.tunnel, "carry", spy)
    client = session()

    async def handler(request: web.Request) -> web.StreamResponse:
        body = await request.read()
        try:
            return await relay(client, request, engine[1], body, keep_auth=True,
                               patience=Patience(10, 10), stream=b'"stream": true' in body)
        except ClientGone as e:
            return e.response

    app = web.Application()
    app.router.add_post("/{tail:.*}", handler)
    async with app_on_loopback(app) as url:
        yield url, carried
    await client.close()


async def test_a_stream_is_carried_whole_and_its_connection_kept(
        front: tuple[str, list[str]]) -> None:
    url, carried = front
    async with aiohttp.ClientSession() as c:
        for n in (40, 3):   # two streams on one kept-alive connection of the client's
            async with c.post(url + "/stream", json={"stream": True, "n": n},
                              headers={"X-Note": "日本 é"}) as r:
                assert r.status == 200 and r.headers["Content-Type"] == "text/event-stream"
                assert r.headers["X-Seen-Connection"] == "close"   # the engine's: not pooled
                assert r.headers["X-Seen-Note"] == "日本 é"   # a client's UTF-8 as it sent it
                got = await r.read()
            assert got == b"".join(EVENTS[:n])
        async with c.post(url + "/stream", json={"stream": False, "n": 2}) as r:
            assert await r.read() == b"".join(EVENTS[:2])   # the relay's own path
        assert c.connector is not None
    assert carried == ["/stream", "/stream"]


async def test_an_engine_dying_inside_a_chunk_ends_the_stream_with_an_error_event(
        front: tuple[str, list[str]]) -> None:
    url, carried = front
    async with aiohttp.ClientSession() as c:
        async with c.post(url + "/die", json={"stream": True}) as r:
            got = await r.read()
    assert got.startswith(EVENTS[0] + b'data: {"half')
    last = got.rsplit(b"data: ", 1)[1]
    assert json.loads(last)["error"]["code"] == "upstream_failed", got
    assert carried == ["/die"]


async def test_a_refusal_with_a_length_is_answered_as_it_came(
        front: tuple[str, list[str]]) -> None:
    url, carried = front
    async with aiohttp.ClientSession() as c:
        async with c.post(url + "/refuse", json={"stream": True}) as r:
            assert r.status == 400
            assert (await r.json())["error"]["message"] == "no"
    assert carried == ["/refuse"]


async def test_a_client_gone_closes_the_engines_connection(
        engine: tuple[Engine, str], front: tuple[str, list[str]]) -> None:
    url, _ = front
    async with aiohttp.ClientSession() as c:
        r = await c.post(url + "/long", json={"stream": True})
        assert await r.content.readany()   # under way
        r.close()                          # the client goes away
    await asyncio.wait_for(engine[0].gone.wait(), 10)   # the engine saw its connection end


async def test_a_client_that_does_not_read_pauses_the_engine(
        engine: tuple[Engine, str], front: tuple[str, list[str]]) -> None:
    """What the gateway holds for a slow client is bounded: it stops reading the engine
    (whose own writes then wait), instead of buffering the whole stream."""
    url, _ = front
    stand_in = engine[0]
    async with aiohttp.ClientSession() as c:
        r = await c.post(url + "/big", json={"stream": True})
        await asyncio.sleep(1.0)          # the client reads nothing meanwhile
        written = stand_in.written
        assert 0 < written < 20_000_000, written   # of 39 MB: the engine waits
        got = 0
        async for chunk in r.content.iter_any():   # once read, the rest comes
            got += len(chunk)
        r.close()
    assert got == 600 * 65_008 and stand_in.written == got


def test_the_framing_is_read_whatever_the_reads_cut() -> None:
    """Chunk sizes, extensions, CRLFs and trailers dropped, the payload kept, however the
    bytes are split between reads (one at a time here)."""
    framed = b"5\r\nhello\r\n1;ext=1\r\n \r\nA\r\n0123456789\r\n0\r\nX-Trailer: t\r\n\r\n"

    async def run() -> tuple[bytes, bool]:
        e = tunnel._Engine()
        e.state = "size"
        out, ended = b"", False
        for i in range(len(framed)):
            payload, ended = e._unframe(framed[i:i + 1])
            out += payload
            if ended:
                assert i == len(framed) - 1
        return out, ended
    assert asyncio.run(run()) == (b"hello 0123456789", True)


async def test_a_client_that_expects_100_continue_gets_the_stream(
        front: tuple[str, list[str]]) -> None:
    """The gateway reads the body itself (aiohttp answers the client's 100); the engine is
    not asked for one, whose interim head would be taken for the answer's."""
    url, carried = front
    body = json.dumps({"stream": True, "n": 4}).encode()
    reader, writer = await asyncio.open_connection("127.0.0.1", int(url.rsplit(":", 1)[1]))
    writer.write(b"POST /stream HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 b"Expect: 100-continue\r\nConnection: close\r\n"
                 b"Content-Length: %d\r\n\r\n" % len(body))
    await writer.drain()
    assert (await reader.readuntil(b"\r\n\r\n")).startswith(b"HTTP/1.1 100")
    writer.write(body)
    answer = await asyncio.wait_for(reader.read(), 10)
    writer.close()
    head, _, rest = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200") and b"chunked" in head.lower(), answer
    assert all(event in rest for event in EVENTS[:4])
    assert carried == ["/stream"]


def test_one_whole_chunk_is_carried_as_it_is_and_nothing_else_is() -> None:
    assert tunnel._one_chunk(b"5\r\nhello\r\n")
    assert tunnel._one_chunk(b"A\r\n0123456789\r\n")
    assert not tunnel._one_chunk(b"5\r\nhell")                     # a part of one
    assert not tunnel._one_chunk(b"5\r\nhello\r\n3\r\nabc\r\n")   # two
    assert not tunnel._one_chunk(b"0\r\n\r\n")                     # the last
    assert not tunnel._one_chunk(b"5;x=1\r\nhello\r\n")            # an extension: unframed
    assert not tunnel._one_chunk(b"zz\r\nhello\r\n")


async def test_a_peer_stream_that_never_connected_may_go_elsewhere_one_that_did_may_not(
        ) -> None:
    """To a peer gateway (a hop), a stream whose connection was never made is Unreached
    (another replica may take it: nothing of it reached the peer); one the peer took and
    closed unanswered is a 502, never sent twice."""
    from support.enginekit import free_port

    from lokid.gateway.relay import Unreached
    from lokid.gateway.replies import GatewayError

    async def closer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")   # the request reached it
        writer.close()
    server = await asyncio.start_server(closer, "127.0.0.1", 0)
    taker = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    nobody = f"http://127.0.0.1:{free_port()}"
    seen: dict[str, str] = {}
    client = session()

    async def handler(request: web.Request) -> web.StreamResponse:
        peer = request.query["peer"]
        try:
            await relay(client, request, peer, b'{"stream": true}', keep_auth=False,
                        patience=Patience(10, 10), target=peer + "/v1/chat/completions",
                        hop="X-Lokid-Hop", stream=True)
        except Unreached:
            seen[peer] = "unreached"
        except GatewayError as e:
            seen[peer] = str(e.status)
        return web.Response(text="")

    app = web.Application()
    app.router.add_post("/", handler)
    try:
        async with app_on_loopback(app) as url, aiohttp.ClientSession() as c:
            for peer in (nobody, taker):
                async with c.post(url + "/", params={"peer": peer}) as r:
                    assert r.status == 200
    finally:
        server.close()
        await client.close()
    assert seen == {nobody: "unreached", taker: "502"}


@pytest.mark.parametrize("verdict", ["first_byte_timeout", "does not answer /health"])
async def test_an_engine_silent_before_its_head_is_a_504_and_its_connection_closed(
        verdict: str) -> None:
    """The wait for the answer's head (silence.HeadWatch: a timer, not a task around the
    wait, issue 47) keeps within()'s two verdicts: first_byte_timeout passed, or the probe
    failing after check_after of silence (the preset then marked hung). Either way the
    engine's connection is closed: the engine frees the slot."""
    from lokid.gateway.replies import GatewayError

    closed = asyncio.Event()

    async def mute(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")   # the request reached it: it never answers
        await reader.read()                   # until the gateway closes the connection
        closed.set()
        writer.close()
    server = await asyncio.start_server(mute, "127.0.0.1", 0)
    engine = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    hung: list[str] = []
    probed: list[bool] = []

    async def probe() -> bool:
        probed.append(True)
        return False

    patience = Patience(0.3, 10) if verdict == "first_byte_timeout" else \
        Patience(30, 10, check_after=0.2, probe=probe, hung=hung.append)
    client = session()
    seen: list[tuple[int, str]] = []

    async def handler(request: web.Request) -> web.StreamResponse:
        try:
            return await relay(client, request, engine, b'{"stream": true}', keep_auth=False,
                               patience=patience, what="the engine of preset 'm'",
                               stream=True)
        except GatewayError as e:
            seen.append((e.status, e.message))
            return web.Response(status=e.status)

    app = web.Application()
    app.router.add_post("/{tail:.*}", handler)
    try:
        async with app_on_loopback(app) as url, aiohttp.ClientSession() as c:
            async with asyncio.timeout(20), \
                    c.post(url + "/v1/chat/completions", json={"stream": True}) as r:
                assert r.status == 504
        await asyncio.wait_for(closed.wait(), 10)
    finally:
        server.close()
        await client.close()
    assert len(seen) == 1 and seen[0][0] == 504 and verdict in seen[0][1], seen
    if verdict == "first_byte_timeout":
        assert not hung
    else:
        assert probed and hung and "does not answer /health" in hung[0]
