"""The relay's ``elsewhere`` (issue 47): to one of several replicas of a preset, a
request none of which reached the engine (its connect refused: a replica killed before
lokid saw its end) fails with :class:`lokid.gateway.relay.Unreached`, which the gateway
answers by sending it to another replica; without ``elsewhere`` (one engine), it is the
502 it always was. A connection reset before any byte of the answer is Unreached only
when the engine is then found gone (:mod:`lokid.gateway.enginegone`), never from one that
lives (a request that crashes engines must not be sent to each replica in turn). Both of
the relay's paths: a stream carried as bytes (:mod:`lokid.gateway.tunnel`) and a plain
request through aiohttp's pool. Ports and sockets are real ones (the engines' stand-ins
answer at the socket level); the whole gateway with a killed replica is
tests/gateway/test_replicas_gateway.py's."""

from __future__ import annotations

import asyncio
import socket
import struct

import httpx
import pytest
from aiohttp import web
from support.gatewaykit import app_on_loopback

from lokid.gateway.enginegone import engine_gone
from lokid.gateway.relay import Unreached, relay, session
from lokid.gateway.replies import GatewayError
from lokid.gateway.silence import Patience


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])   # closed on leaving: its connect is refused


async def relayed(url: str, stream: bool, elsewhere: bool
                  ) -> tuple[httpx.Response, list[BaseException]]:
    """A request relayed to the engine at ``url`` through a server whose handler is the
    relay: the client's answer, and the GatewayError the relay raised."""
    client = session()
    seen: list[BaseException] = []

    async def handle(request: web.Request) -> web.StreamResponse:
        body = await request.read()
        try:
            return await relay(client, request, url, body, keep_auth=False,
                               patience=Patience(10, 10), what="the engine", stream=stream,
                               elsewhere=elsewhere)
        except GatewayError as e:
            seen.append(e)
            return web.json_response(e.body(), status=e.status)

    app = web.Application()
    app.router.add_post("/v1/completions", handle)
    try:
        async with app_on_loopback(app) as front, \
                httpx.AsyncClient(base_url=front, timeout=30) as c:
            r = await c.post("/v1/completions", content=b'{"stream": %s}' % (
                b"true" if stream else b"false"))
    finally:
        await client.close()
    return r, seen


@pytest.mark.parametrize("stream", [True, False], ids=["tunnel", "pool"])
@pytest.mark.parametrize("elsewhere", [True, False], ids=["replicas", "one-engine"])
async def test_a_refused_connect_is_unreached_only_where_another_engine_may_take_it(
        stream: bool, elsewhere: bool) -> None:
    url = f"http://127.0.0.1:{closed_port()}"
    r, seen = await relayed(url, stream, elsewhere)
    assert r.status_code == 502 and r.json()["error"]["code"] == "upstream_unreachable", r.text
    assert len(seen) == 1 and isinstance(seen[0], Unreached) == elsewhere, seen


class Crashing:
    """An engine stand-in at the socket level: it reads a request and resets the
    connection before any byte of an answer; ``dies``: it closes its listening socket
    first (a process killed), else it keeps listening (a request that made an engine
    alive drop it, or one that kills engines: never sent on to another)."""

    def __init__(self, dies: bool):
        self.dies = dies
        self.server: asyncio.Server | None = None
        self.requests = 0

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        self.requests += 1
        if self.dies and self.server is not None:
            self.server.close()   # nothing listens there any more
        sock = writer.get_extra_info("socket")
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        writer.transport.abort()   # RST: reset by peer, no answer

    async def __aenter__(self) -> str:
        self.server = await asyncio.start_server(self.handle, "127.0.0.1", 0)
        return f"http://127.0.0.1:{self.server.sockets[0].getsockname()[1]}"

    async def __aexit__(self, *_exc: object) -> None:
        assert self.server is not None
        self.server.close()


@pytest.mark.parametrize("stream", [True, False], ids=["tunnel", "pool"])
@pytest.mark.parametrize("dies", [True, False], ids=["gone", "alive"])
async def test_a_reset_before_the_answer_is_unreached_only_from_an_engine_found_gone(
        stream: bool, dies: bool) -> None:
    engine = Crashing(dies)
    async with engine as url:
        r, seen = await relayed(url, stream, True)
    assert r.status_code == 502, r.text
    assert len(seen) == 1
    assert isinstance(seen[0], Unreached) == dies, seen
    assert not dies or seen[0].sent   # type: ignore[attr-defined]
    # the pool's path sends once more on a new connection (a kept-alive one the engine
    # closed meanwhile cannot be told from a reset): one that lives saw it twice
    assert engine.requests == (1 if dies or stream else 2)


async def test_the_probe_tells_a_live_engine_from_a_gone_one() -> None:
    """engine_gone: refused; taken into a listening socket's queue and reset when that
    socket closes (a process dying); held open by a live server."""
    assert await engine_gone("127.0.0.1", closed_port())
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(4)   # never accepts
    probe = asyncio.create_task(engine_gone("127.0.0.1", listener.getsockname()[1]))
    await asyncio.sleep(0.1)
    listener.close()
    assert await probe

    async def hold(reader: asyncio.StreamReader, _writer: asyncio.StreamWriter) -> None:
        await reader.read(1)

    server = await asyncio.start_server(hold, "127.0.0.1", 0)
    try:
        assert not await engine_gone("127.0.0.1", server.sockets[0].getsockname()[1])
    finally:
        server.close()
