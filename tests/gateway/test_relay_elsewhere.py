"""The relay's ``elsewhere`` (issue 47): to one of several replicas of a preset, a
request none of which reached the engine (its connect refused: a replica killed before
lokid saw its end) fails with :class:`lokid.gateway.relay.Unreached`, which the gateway
answers by sending it to another replica; without ``elsewhere`` (one engine), it is the
502 it always was. Both of the relay's paths: a stream carried as bytes
(:mod:`lokid.gateway.tunnel`) and a plain request through aiohttp's pool. The closed port
is a real one (bound, then closed); the whole gateway with a killed replica is
tests/gateway/test_replicas_gateway.py's."""

from __future__ import annotations

import socket

import httpx
import pytest
from aiohttp import web
from support.gatewaykit import app_on_loopback

from lokid.gateway.relay import Unreached, relay, session
from lokid.gateway.replies import GatewayError
from lokid.gateway.silence import Patience


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])   # closed on leaving: its connect is refused


@pytest.mark.parametrize("stream", [True, False], ids=["tunnel", "pool"])
@pytest.mark.parametrize("elsewhere", [True, False], ids=["replicas", "one-engine"])
async def test_a_refused_connect_is_unreached_only_where_another_engine_may_take_it(
        stream: bool, elsewhere: bool) -> None:
    url = f"http://127.0.0.1:{closed_port()}"
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
    assert r.status_code == 502 and r.json()["error"]["code"] == "upstream_unreachable", r.text
    assert len(seen) == 1 and isinstance(seen[0], Unreached) == elsewhere, seen
