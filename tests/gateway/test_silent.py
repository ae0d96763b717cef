"""Connections that send nothing (issue 45, item 1): the gateway closes them itself, on
every aiohttp, and near its descriptor limit closes the idle ones first so that an
honest client is still served (:mod:`lokid.gateway.headtimeout`).

Here on the test venv's aiohttp, in the test's event loop (asyncio's and uvloop's), with
the bounds shortened; the real unit on Debian 12's and 13's python3-aiohttp, whose
aiohttp arms no timer of its own for a silent connection, with a real lowered
``LimitNOFILE=``, is tests/packaging/test_deb_silent.py. The real daemon serves the
gateway on a private bus."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from support.enginekit import free_port, write_config, write_preset
from support.gatewaykit import LOOPS, gateway_on, loop_policy

from lokid.gateway.headtimeout import connection_cap
from lokid.gateway.server import Gateway

Conn = tuple[asyncio.StreamReader, asyncio.StreamWriter]
HEALTH = b"GET /health HTTP/1.1\r\nHost: localhost\r\n\r\n"


@pytest.fixture
def config(tmp_path: Path, engine: str, models: Any) -> Path:
    config = write_config(tmp_path, engine, [models.dir])
    write_preset(config, "alpha", f'model = "llama.gguf"\nctx = 2048\nport = {free_port()}\n')
    return config


@pytest.fixture(params=LOOPS)
def event_loop_policy(request: pytest.FixtureRequest) -> asyncio.AbstractEventLoopPolicy:
    return loop_policy(request.param)


@pytest.fixture
async def gw(running: Any, bus_address: str) -> AsyncIterator[Gateway]:
    """The gateway with its silent and keep-alive bounds at half a second."""
    async with gateway_on(bus_address) as gateway:
        gateway.connections.silent = 0.5
        gateway.connections.keepalive = 0.5
        yield gateway


async def connect(gw: Gateway) -> Conn:
    port = int(gw.url.rsplit(":", 1)[1])  # type: ignore[attr-defined]
    return await asyncio.open_connection("127.0.0.1", port)


async def answer(reader: asyncio.StreamReader) -> bytes:
    """One whole answer's head (its body read and dropped)."""
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
    length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n")
                  if line.lower().startswith(b"content-length"))
    await reader.readexactly(length)
    return head


async def closed_unanswered(reader: asyncio.StreamReader, within: float) -> bool:
    """Whether the gateway closed the connection within ``within`` s, having sent nothing."""
    try:
        return await asyncio.wait_for(reader.read(), within) == b""
    except TimeoutError:
        return False


async def test_a_connection_that_never_sends_a_byte_is_closed(gw: Gateway) -> None:
    reader, writer = await connect(gw)
    assert await closed_unanswered(reader, 5)   # without it: aiohttp's own, if any
    writer.close()


async def test_an_idle_keep_alive_connection_is_closed(gw: Gateway) -> None:
    reader, writer = await connect(gw)
    writer.write(HEALTH)
    assert (await answer(reader)).startswith(b"HTTP/1.1 200 ")
    assert await closed_unanswered(reader, 5)
    writer.close()


async def test_a_connection_that_keeps_asking_stays_open(gw: Gateway) -> None:
    """The bounds count silence, not age: four requests a quarter second apart, on one
    connection open for longer than both bounds."""
    reader, writer = await connect(gw)
    for _ in range(4):
        writer.write(HEALTH)
        assert (await answer(reader)).startswith(b"HTTP/1.1 200 ")
        await asyncio.sleep(0.25)
    assert not reader.at_eof()
    writer.close()


async def test_near_the_limit_the_longest_idle_close_first_and_health_is_served(
        gw: Gateway) -> None:
    gw.connections.silent = gw.connections.keepalive = 3600.0   # only the cap closes here
    gw.connections.cap = 40
    busy = await connect(gw)   # a request whose body has not come: served, not idle
    body = b'{"model": "nope", "messages": []}'
    busy[1].write(b"POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\n"
                  b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(body))
    await asyncio.sleep(0.2)
    silent: list[Conn] = []
    for _ in range(60):
        silent.append(await connect(gw))
    await asyncio.sleep(0.2)
    reader, writer = await connect(gw)
    writer.write(HEALTH)
    assert (await answer(reader)).startswith(b"HTTP/1.1 200 ")
    gone = [await closed_unanswered(r, 0.05) for r, _ in silent]
    assert gone[0] and all(gone[:20]), gone          # the oldest went first
    assert sum(not g for g in gone) >= 30 and not gone[-1], gone   # the newer stayed
    assert len(gw.connections.live) + gw.connections.busy <= 40
    busy[1].write(body)                              # the busy one was kept
    assert (await answer(busy[0])).startswith(b"HTTP/1.1 4")   # its 404, answered
    for _, w in [*silent, busy, (reader, writer)]:
        w.close()


@pytest.mark.parametrize(("limit", "cap"), [(1024, 896), (16384, 14336), (100, 36), (50, 1)])
def test_the_connections_leave_a_reserve_of_the_descriptors(limit: int, cap: int) -> None:
    assert connection_cap(limit) == cap
