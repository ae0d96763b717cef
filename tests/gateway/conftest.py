"""The gateway in the test's event loop, on the private bus of the daemon under test."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
from support.enginekit import free_port
from support.gatewaykit import gateway_on

from lokid.gateway.server import Gateway


@pytest.fixture
def ports() -> dict[str, int]:
    """The engine ports of the two presets, alpha and beta, most tests here serve."""
    return {"alpha": free_port(), "beta": free_port()}


@pytest.fixture
async def gateway(running: Any, bus_address: str) -> AsyncIterator[Gateway]:
    async with gateway_on(bus_address) as gw:
        yield gw
