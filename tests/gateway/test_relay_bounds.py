"""The relay's own bounds (issue 45, item 2), without a daemon: what it reads whole to
parse (``whole``: the gateway's ``/props``) is refused past its cap, with a length or
without, and :class:`lokid.gateway.relay.Renamer` holds back a few bytes of an answer,
never a line. The whole gateway's memory under a 600 MiB answer is
tests/gateway/test_huge_answers.py's."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

import httpx
import pytest
from aiohttp import web
from support.gatewaykit import app_on_loopback

from lokid.gateway.relay import Renamer, relay, session
from lokid.gateway.replies import GatewayError
from lokid.gateway.silence import Patience

CAP = 64 * 1024
BIG = {"chat_template": "x" * (CAP + 1)}   # a /props over the cap


@pytest.fixture
async def front() -> AsyncIterator[str]:
    """An engine stand-in (a real aiohttp server) and, before it, a server whose handler
    is the relay reading its answer whole (as the gateway's ``/props``)."""

    async def props(request: web.Request) -> web.StreamResponse:
        data = json.dumps(BIG if request.query.get("big") else {"n_ctx": 1}).encode()
        if request.query.get("chunked"):   # no length said: the bound is met while reading
            response = web.StreamResponse()
            response.enable_chunked_encoding()
            await response.prepare(request)
            for i in range(0, len(data), 4096):
                await response.write(data[i:i + 4096])
            await response.write_eof()
            return response
        return web.Response(body=data, content_type="application/json")

    engine = web.Application()
    engine.router.add_get("/props", props)
    async with app_on_loopback(engine) as url:
        client = session()

        async def handle(request: web.Request) -> web.StreamResponse:
            try:
                return await relay(client, request, url, b"", keep_auth=False,
                                   patience=Patience(10, 10), what="the engine", whole=CAP)
            except GatewayError as e:
                return web.json_response(e.body(), status=e.status)

        app = web.Application()
        app.router.add_get("/props", handle)
        try:
            async with app_on_loopback(app) as front_url:
                yield front_url
        finally:
            await client.close()


@pytest.mark.parametrize("chunked", [False, True], ids=["length", "chunked"])
async def test_an_answer_read_whole_is_refused_past_its_cap(front: str, chunked: bool) -> None:
    extra = "&chunked=1" if chunked else ""
    async with httpx.AsyncClient(base_url=front, timeout=30) as c:
        small = await c.get(f"/props?small=1{extra}")
        big = await c.get(f"/props?big=1{extra}")
    assert small.status_code == 200 and small.json() == {"n_ctx": 1}, small.text
    assert isinstance(small, httpx.Response) and "chunked" not in small.headers.get(
        "transfer-encoding", "")   # read whole: answered with its length
    assert big.status_code == 502, big.text[:200]
    assert big.json()["error"]["code"] == "upstream_too_large"
    assert big.json()["error"]["message"] == (
        "the engine answered over 64 KiB, more than the gateway reads")


def test_a_renamed_answer_on_one_line_is_held_back_by_a_few_bytes_only() -> None:
    """A 4 MiB answer on one line, in 1 KiB parts: each part is written on but for the
    bytes a match could still need, and the whole reads as renamed at once."""
    answer = (b'{"model": "up-model", "pad": "' + b"a" * (4 << 20) + b'", "usage": '
              b'{"model":"up-model"}}')
    renamer = Renamer("up-model", "preset")
    out, held = [], 0
    for i in range(0, len(answer), 1024):
        out.append(renamer.chunk(answer[i:i + 1024]))
        held = max(held, len(renamer.rest))
    out.append(renamer.end())
    assert b"".join(out) == Renamer("up-model", "preset").whole(answer)
    assert b"".join(out).count(b'"preset"') == 2
    assert held <= renamer.keep < 100, held
