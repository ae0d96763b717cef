"""An external API that drops idle connections (issue 28, item 5).

1 in 300-500 requests to an external preset failed with "Server disconnected": the
gateway's pool kept a connection 15 s between requests (aiohttp's default), past the
API's own keep-alive, and handed out one the API had closed. An API's request is never
sent twice (it may cost twice), so the pool keeps connections shorter than the APIs
do (:data:`lokid.gateway.relay.EXTERNAL_KEEPALIVE`).

The API here (a real HTTP/1.1 server on a socket) forgets a connection that rested
:data:`FORGETS` seconds, without telling, as a load balancer or NAT in front of an API
does (and as a server does when its FIN is still on the way): the next request on it is
answered by a close. The one figure asserted is behaviour: a second request after such
a rest is answered. The gateway of today's main reused the connection (502).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from support.enginekit import write_config, write_preset
from support.gatewaykit import gateway_on

from lokid.gateway.relay import EXTERNAL_KEEPALIVE

pytestmark = pytest.mark.engine   # the daemon under test plans its presets with the engine

FORGETS = EXTERNAL_KEEPALIVE + 0.3   # the API's idle time: just above the gateway's


class ForgetfulAPI:
    """Chat completions over keep-alive connections; a request that arrives on a
    connection after it rested FORGETS seconds is answered by closing it."""

    def __init__(self) -> None:
        self.answered = 0
        self.dropped = 0
        self.connections = 0   # those that carried a chat
        self.server: asyncio.Server | None = None

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        rested_since = time.monotonic()
        carried = False   # a chat on this connection already
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                if time.monotonic() - rested_since > FORGETS:
                    self.dropped += 1
                    return   # the close below: forgotten, no answer
                lengths = [int(line.split(b":", 1)[1]) for line in head.split(b"\r\n")
                           if line.lower().startswith(b"content-length:")]
                if not lengths:   # the gateway's reachability probe (GET)
                    writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                                 b"Content-Length: 11\r\n\r\n{\"data\":[]}")
                    await writer.drain()
                    rested_since = time.monotonic()
                    continue
                model = json.loads(await reader.readexactly(lengths[0]))["model"]
                if not carried:
                    carried, self.connections = True, self.connections + 1
                body = json.dumps({"id": "x", "object": "chat.completion", "created": 0,
                                   "model": model, "choices": [{
                                       "index": 0, "finish_reason": "stop", "message": {
                                           "role": "assistant", "content": "hi"}}]}).encode()
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                             b"Content-Length: %d\r\n\r\n" % len(body) + body)
                await writer.drain()
                self.answered += 1
                rested_since = time.monotonic()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()


@pytest.fixture
async def api() -> AsyncIterator[tuple[ForgetfulAPI, int]]:
    forgetful = ForgetfulAPI()
    server = await asyncio.start_server(forgetful.serve, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        yield forgetful, port
    finally:
        server.close()


@pytest.fixture
def config(tmp_path: Path, engine: str, models: Any, api: tuple[ForgetfulAPI, int]) -> Path:
    config = write_config(tmp_path, engine, [models.dir])
    write_preset(config, "remote", f'kind = "external"\nurl = "http://127.0.0.1:{api[1]}/v1"\n'
                 'upstream_model = "far"\n')
    return config


async def test_a_request_after_the_apis_idle_time_is_answered(
        running: Any, bus_address: str, api: tuple[ForgetfulAPI, int]) -> None:
    forgetful, _ = api
    chat = {"model": "remote", "messages": [{"role": "user", "content": "Hi"}]}
    async with gateway_on(bus_address) as gw, httpx.AsyncClient(
            base_url=gw.url, timeout=30) as client:  # type: ignore[attr-defined]
        codes = []
        for _ in range(3):
            r = await client.post("/v1/chat/completions", json=chat)
            codes.append(r.status_code)
            assert r.status_code != 200 or r.json()["model"] == "remote"
            await asyncio.sleep(FORGETS + 0.2)   # longer than the API keeps a connection
        # back to back: the pool's connection is used again, not one per request
        for _ in range(3):
            codes.append((await client.post("/v1/chat/completions", json=chat)).status_code)
    assert codes == [200] * 6, (codes, forgetful.dropped)
    assert forgetful.dropped == 0
    assert forgetful.answered == 6
    assert forgetful.connections <= 4, forgetful.connections
