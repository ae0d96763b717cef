"""``lokid gateway`` as the unit will run it: its settings refused with exit 2 and one line,
and the real process serving the daemon's presets from a private bus."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from support.enginekit import free_port, write_config, write_preset

from lokid.core.errors import ConfigError
from lokid.core.serve.tables import GatewayConfig
from lokid.gateway.settings import read_keys, settings_of


def lokid(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "lokid", *args], capture_output=True,
                          text=True, timeout=60, stdin=subprocess.DEVNULL)


@pytest.fixture
def config(tmp_path: Path, engine: str, models: Any) -> Path:
    assert Path(models.llama).name == "llama.gguf"
    config = write_config(tmp_path, engine, [models.dir])
    write_preset(config, "alpha", f'model = "llama.gguf"\nctx = 2048\nport = {free_port()}\n')
    return config


def test_settings_refused(config: Path, tmp_path: Path) -> None:
    r = lokid("--config-dir", str(config), "gateway", "--bus", "session")
    assert r.returncode == 2 and "the gateway is off" in r.stderr
    r = lokid("--config-dir", str(config), "gateway", "--listen", "0.0.0.0:8000")
    assert r.returncode == 2 and "beyond loopback" in r.stderr and "api_keys_file" in r.stderr
    r = lokid("--config-dir", str(config), "gateway", "--listen", "localhost:8000")
    assert r.returncode == 2 and "not an IP address" in r.stderr
    (tmp_path / "keys").write_text("# none yet\n\n")
    with (config / "lokid.toml").open("a") as f:
        f.write(f'[gateway]\nlisten = ["127.0.0.1:{free_port()}"]\n'
                f'api_keys_file = "{tmp_path / "keys"}"\n')
    r = lokid("--config-dir", str(config), "gateway", "--bus", "session")
    assert r.returncode == 2 and "holds no key" in r.stderr, r.stderr
    assert "Traceback" not in r.stderr


def test_keys_and_listen_rules(tmp_path: Path) -> None:
    keys = tmp_path / "keys"
    keys.write_text("# clients\nk-one\n\n  k-two  \n")
    assert read_keys(str(keys)) == {"k-one", "k-two"}
    with pytest.raises(ConfigError, match="cannot read"):
        read_keys(str(tmp_path / "absent"))
    s = settings_of(GatewayConfig(listen=("127.0.0.1:8000",), max_body=2048),
                    ["[::1]:9000", "127.0.0.2:9001"])
    assert s.listen == (("::1", 9000), ("127.0.0.2", 9001)) and s.max_body == 2048
    assert settings_of(GatewayConfig(listen=("0.0.0.0:8000",), api_keys_file="/k")).listen \
        == (("0.0.0.0", 8000),)
    with pytest.raises(ConfigError, match="beyond loopback"):
        settings_of(GatewayConfig(), ["10.0.0.1:80"])


async def test_the_command_serves_the_daemons_presets(running: Any, bus_address: str,
                                                      config: Path) -> None:
    port = free_port()
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "lokid", "--config-dir", str(config), "gateway", "--bus",
        "session", "--bus-address", bus_address, "--listen", f"127.0.0.1:{port}",
        stdin=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=5) as c:
            deadline = time.monotonic() + 30
            while True:
                try:
                    r = await c.get("/health")
                    break
                except httpx.TransportError:
                    assert time.monotonic() < deadline and proc.returncode is None
                    await asyncio.sleep(0.1)
            assert r.json() == {"status": "ok", "lokid": "reachable"}
            models = (await c.get("/v1/models")).json()["data"]
            assert [m["id"] for m in models] == ["alpha"]
        proc.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(proc.wait(), 30) == 0
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
