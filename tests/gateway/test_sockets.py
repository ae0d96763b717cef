"""lokid.gateway.sockets and lokid.host.sockshare: an engine reached at its UNIX socket.

Two stand-in engines over real sockets, told apart by what they answer: one on a UNIX
socket (where an on-demand engine listens under systemd), one on loopback (its port's
relay). The gateway's pool and its byte tunnel, given a route from the port's address to
the socket, must reach the socket; with the socket gone or refusing, the port, said once
in the log. The real engine under systemd: tests/gateway/test_units_systemd.py.
"""

from __future__ import annotations

import asyncio
import grp
import logging
import os
import socket
import stat
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from support.gatewaykit import LOOPS, app_on_loopback, loop_policy
from yarl import URL

from lokid.gateway import sockets
from lokid.gateway.relay import ClientGone, relay, session
from lokid.gateway.silence import Patience
from lokid.host.sockshare import MODE, share_with_gateway


@pytest.fixture(params=LOOPS)
def event_loop_policy(request: pytest.FixtureRequest) -> asyncio.AbstractEventLoopPolicy:
    return loop_policy(request.param)


def stand_in(via: str) -> web.Application:
    async def health(_request: web.Request) -> web.Response:
        return web.json_response({"via": via})

    async def stream(_request: web.Request) -> web.StreamResponse:
        r = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        r.enable_chunked_encoding()
        await r.prepare(_request)
        for i in range(3):
            await r.write(f'data: {{"i": {i}, "via": "{via}"}}\n\n'.encode())
        await r.write_eof()
        return r

    app = web.Application()
    app.router.add_get("/health", health)
    app.router.add_post("/stream", stream)
    return app


@pytest.fixture
async def engines(tmp_path: Path) -> AsyncIterator[tuple[str, str]]:
    """The port's URL (loopback) and the engine's socket."""
    path = str(tmp_path / "alpha.sock")
    runner = web.AppRunner(stand_in("socket"))
    await runner.setup()
    await web.UnixSite(runner, path).start()
    sockets.FALLBACKS.said.clear()
    try:
        async with app_on_loopback(stand_in("port")) as url:
            yield url, path
    finally:
        await runner.cleanup()


def route_to(url: str, path: str) -> sockets.Route:
    u = URL(url)
    return lambda host, port: path if (host, port) == (u.host, u.port) else ""


async def via(client: Any, url: str) -> str:
    async with client.get(url + "/health") as r:
        assert r.status == 200
        return str((await r.json())["via"])


async def test_the_pool_reaches_an_engine_at_its_socket(engines: tuple[str, str]) -> None:
    url, path = engines
    client = session(route=route_to(url, path))
    try:
        assert await via(client, url) == "socket"
        assert await via(client, url) == "socket"   # the kept connection, or a new one
        # an address the route does not name: as before
        assert await via(client, url.replace("127.0.0.1", "localhost")) == "port"
    finally:
        await client.close()
    plain = session()   # without a route (external APIs, and before this change)
    try:
        assert await via(plain, url) == "port"
    finally:
        await plain.close()


async def test_a_socket_gone_or_refusing_falls_back_to_the_port_said_once(
        engines: tuple[str, str], tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    url, _ = engines
    missing = str(tmp_path / "none.sock")
    stale = str(tmp_path / "stale.sock")   # a socket file nobody listens on any more
    s = socket.socket(socket.AF_UNIX)
    s.bind(stale)
    s.close()
    caplog.set_level(logging.INFO, "lokid.gateway")
    for path, why in ((missing, "No such file or directory"), (stale, "Connection refused")):
        for _ in range(3):   # a new pool each time: a new connection
            client = session(route=route_to(url, path))
            try:
                assert await via(client, url) == "port"
            finally:
                await client.close()
        said = [r.getMessage() for r in caplog.records if path in r.getMessage()]
        assert len(said) == 1 and why in said[0] and "through its port" in said[0], said


async def test_a_stream_is_tunnelled_from_the_socket(engines: tuple[str, str]) -> None:
    url, path = engines
    client = session(route=route_to(url, path))

    async def handler(request: web.Request) -> web.StreamResponse:
        body = await request.read()
        try:
            return await relay(client, request, url, body, keep_auth=True,
                               patience=Patience(10, 10), stream=True)
        except ClientGone as e:
            return e.response

    app = web.Application()
    app.router.add_post("/{tail:.*}", handler)
    try:
        async with app_on_loopback(app) as front:
            import aiohttp

            async with aiohttp.ClientSession() as c, \
                    c.post(front + "/stream", json={"stream": True}) as r:
                got = await r.read()
    finally:
        await client.close()
    assert got.count(b'"via": "socket"') == 3 and b"port" not in got, got
    # the tunnel's own connect, without the pool
    loop = asyncio.get_running_loop()
    done = loop.create_future()

    class Head(asyncio.Protocol):
        def data_received(self, data: bytes) -> None:
            if not done.done():
                done.set_result(data)
    u = URL(url)
    assert u.host is not None and u.port is not None
    transport, _ = await sockets.open_engine(Head, u.host, u.port, route_to(url, path), 5)
    try:
        assert transport.get_extra_info("peername") == path
        transport.write(b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        assert b'"via": "socket"' in await asyncio.wait_for(done, 5)
    finally:
        transport.close()


def test_an_engine_socket_is_given_to_the_gateway_group(tmp_path: Path) -> None:
    path = str(tmp_path / "beta.sock")
    s = socket.socket(socket.AF_UNIX)
    s.bind(path)
    try:
        os.chmod(path, 0o750)
        group = grp.getgrgid(os.getgid()).gr_name   # one this process may give it to
        assert share_with_gateway(path, group) == ""
        st = os.stat(path)
        assert stat.S_IMODE(st.st_mode) == MODE == 0o660 and st.st_gid == os.getgid()
        assert share_with_gateway(path, "no-such-group-here") == "no group no-such-group-here"
        gone = str(tmp_path / "gone.sock")
        assert share_with_gateway(gone, group).startswith(f"{gone}: No such file")
    finally:
        s.close()
