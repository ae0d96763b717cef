"""``lokid gateway`` as loki-gateway.service runs it: on the sockets systemd hands it
(``LISTEN_FDS``), here by ``systemd-socket-activate``, which listens, waits for the first
connection and then runs the gateway on its socket, as a socket unit does; and with its
client keys from systemd's credential copy (``LOKI_CREDENTIALS_DIR``), not the file."""

from __future__ import annotations

import asyncio
import signal
import socket
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
from support import REPO
from support.enginekit import free_port, write_config, write_preset

from lokid.core.errors import ConfigError
from lokid.gateway.settings import keys_path, read_keys

ACTIVATE = "systemd-socket-activate"


@pytest.fixture
def config(tmp_path: Path, engine: str, models: Any) -> Path:
    # no [gateway] listen at all: under systemd the socket unit says where
    assert Path(models.llama).name == "llama.gguf"   # written on first use: run alone, the
    config = write_config(tmp_path, engine, [models.dir])   # preset had no model file
    write_preset(config, "alpha", f'model = "llama.gguf"\nctx = 2048\nport = {free_port()}\n')
    return config


@asynccontextmanager
async def activated(listen: str, config: Path, *args: str, env: dict[str, str] | None = None
                    ) -> AsyncIterator[asyncio.subprocess.Process]:
    """``lokid gateway`` behind ``systemd-socket-activate -l listen``: started by the first
    connection, on that socket. ``env``: variables it passes (-E) beside PYTHONPATH."""
    passed = [f"-E{k}={v}" for k, v in (env or {}).items()]
    proc = await asyncio.create_subprocess_exec(
        ACTIVATE, "-l", listen, f"-EPYTHONPATH={REPO}", *passed, sys.executable, "-m",
        "lokid", "--config-dir", str(config), "gateway", *args,
        stdin=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        yield proc
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


async def listening(port: int, proc: asyncio.subprocess.Process) -> None:
    """Until systemd-socket-activate holds the port (it binds, then waits to be called)."""
    for _ in range(200):
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            assert proc.returncode is None
            await asyncio.sleep(0.05)
    raise AssertionError(f"nothing listens on {port}")


async def test_the_gateway_serves_on_systemds_socket_and_reads_the_keys_credential(
        running: Any, bus_address: str, config: Path, tmp_path: Path) -> None:
    # lokid.toml names a keys file the gateway's user could not read (absent here);
    # the credential directory holds systemd's copy, which is what it must read
    creds = tmp_path / "creds"
    creds.mkdir()
    (creds / "gateway-api-keys").write_text("k-from-credential\n")
    with (config / "lokid.toml").open("a") as f:
        f.write(f'[gateway]\napi_keys_file = "{tmp_path / "root-only.keys"}"\n')
    port = free_port()
    async with activated(f"127.0.0.1:{port}", config, "--bus", "session", "--bus-address",
                         bus_address, env={"LOKI_CREDENTIALS_DIR": str(creds)}) as proc:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=60) as c:
            # the first connection starts it; it waits in the socket's backlog meanwhile
            r = await c.get("/v1/models")
            assert r.status_code == 401, r.text
            r = await c.get("/v1/models",
                            headers={"Authorization": "Bearer k-from-credential"})
            assert r.status_code == 200, r.text
            assert [m["id"] for m in r.json()["data"]] == ["alpha"]
        proc.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(proc.wait(), 30) == 0
        assert proc.stderr is not None
        said = (await proc.stderr.read()).decode()
    assert f"gateway listening on systemd's sockets 127.0.0.1:{port}" in said, said
    assert "k-from-credential" not in said


@pytest.mark.parametrize("listen", ["0.0.0.0", "[::]"])
async def test_a_socket_beyond_loopback_without_keys_is_refused(tmp_path: Path,
                                                                listen: str) -> None:
    config = write_config(tmp_path, "/usr/bin/llama-server", [tmp_path])
    port = free_port()
    async with activated(f"{listen}:{port}", config) as proc:
        await listening(port, proc)
        assert await asyncio.wait_for(proc.wait(), 30) == 2
        assert proc.stderr is not None
        said = (await proc.stderr.read()).decode()
    assert f"beyond loopback ({listen}:{port})" in said and "api_keys_file" in said, said
    assert "Traceback" not in said


def test_keys_come_from_the_credential_under_systemd(tmp_path: Path) -> None:
    assert keys_path("/etc/loki/gateway.keys", {}) == "/etc/loki/gateway.keys"
    copy = keys_path("/etc/loki/gateway.keys", {"LOKI_CREDENTIALS_DIR": str(tmp_path) + "/"})
    assert copy == f"{tmp_path}/gateway-api-keys"
    # the unit names the directory even before the generator gave it the credential
    with pytest.raises(ConfigError, match="systemctl daemon-reload") as e:
        read_keys(copy, "/etc/loki/gateway.keys")
    assert "/etc/loki/gateway.keys" in str(e.value)
