"""The gateway in the test's event loop, on the private bus of the daemon under test:
:func:`gateway_on`. Here, not in tests/gateway/conftest.py, so that test modules import
it by a name of its own (``from conftest import`` finds whichever conftest.py was
imported last)."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from typing import Any

from dbus_fast.aio import MessageBus

from lokid.gateway.headtimeout import HEAD_TIMEOUT
from lokid.gateway.presets import Presets
from lokid.gateway.server import Gateway, start_sites
from lokid.gateway.settings import Settings

from .enginekit import free_port


@contextlib.asynccontextmanager
async def gateway_on(bus_address: str, **settings: Any) -> AsyncIterator[Gateway]:
    """The gateway on a free loopback port (or ``port=``; ``gateway.url``) until the block
    ends."""
    keys = settings.pop("keys", frozenset())
    head_timeout = settings.pop("head_timeout", HEAD_TIMEOUT)
    port = settings.pop("port", None) or free_port()
    bus = await MessageBus(bus_address=bus_address).connect()
    presets = Presets(bus)
    await presets.attach()
    gateway = Gateway(Settings((("127.0.0.1", port),), **settings), presets, keys)
    gateway.url = f"http://127.0.0.1:{port}"  # type: ignore[attr-defined]
    runner = await start_sites(gateway, head_timeout=head_timeout)
    try:
        yield gateway
    finally:
        await runner.cleanup()
        bus.disconnect()


async def until(check: Any, timeout: float, what: str) -> Any:
    """``await check()`` again every 0.1 s until it is true (returned); AssertionError
    naming ``what`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = await check()
        if got:
            return got
        await asyncio.sleep(0.1)
    raise AssertionError(f"not {what} in {timeout} s")


async def health_answered(port: int, proc: asyncio.subprocess.Process, said: Any = None,
                          timeout: float = 30) -> None:
    """Until a gateway process started on ``port`` answers ``/health`` (AssertionError,
    with ``said``, its output so far, when it exits or ``timeout`` passes first)."""
    import httpx

    deadline = time.monotonic() + timeout
    async with httpx.AsyncClient(timeout=5) as c:
        while True:
            try:
                await c.get(f"http://127.0.0.1:{port}/health")
                return
            except httpx.TransportError:
                assert time.monotonic() < deadline and proc.returncode is None, said
                await asyncio.sleep(0.1)


@contextlib.asynccontextmanager
async def app_on_loopback(app: Any, port: int | None = None) -> AsyncIterator[str]:
    """A real aiohttp ``app`` served on 127.0.0.1 (``port``, else a free one) for the
    block: its base URL, ``http://127.0.0.1:PORT``."""
    from aiohttp import web

    runner = web.AppRunner(app)
    await runner.setup()
    port = free_port() if port is None else port
    await web.TCPSite(runner, "127.0.0.1", port).start()
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        await runner.cleanup()


LOOPS = ("asyncio", "uvloop")   # the loops the gateway runs on (lokid.gateway.server.run)


def loop_policy(name: str) -> asyncio.AbstractEventLoopPolicy:
    """The event loop policy of one of :data:`LOOPS`: a test module's
    ``event_loop_policy`` fixture, parametrized over them, runs each test on both (uvloop's
    transports and timers are not asyncio's)."""
    if name == "uvloop":
        import uvloop  # a test dependency (pyproject's test extra)

        return uvloop.EventLoopPolicy()
    return asyncio.DefaultEventLoopPolicy()
