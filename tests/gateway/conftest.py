"""The gateway in the test's event loop, on the private bus of the daemon under test."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

import pytest
from dbus_fast.aio import MessageBus
from support.enginekit import free_port

from lokid.gateway.headtimeout import HEAD_TIMEOUT
from lokid.gateway.presets import Presets
from lokid.gateway.server import Gateway, start_sites
from lokid.gateway.settings import Settings


@contextlib.asynccontextmanager
async def gateway_on(bus_address: str, **settings: Any) -> AsyncIterator[Gateway]:
    """The gateway on a free loopback port (``gateway.url``) until the block ends."""
    keys = settings.pop("keys", frozenset())
    head_timeout = settings.pop("head_timeout", HEAD_TIMEOUT)
    port = free_port()
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


@pytest.fixture
def ports() -> dict[str, int]:
    """The engine ports of the two presets, alpha and beta, most tests here serve."""
    return {"alpha": free_port(), "beta": free_port()}


@pytest.fixture
async def gateway(running: Any, bus_address: str) -> AsyncIterator[Gateway]:
    async with gateway_on(bus_address) as gw:
        yield gw
