"""What a web page can make a keyless gateway do (issue 45, item 5), against the real
gateway, the real daemon on a private bus (its local runner) and real engines.

A page after DNS rebinding names the gateway by its own name (``Host:
attacker.example``): refused 421, one rate-limited log line; /health answers any name.
A page's ``<img src=".../props?model=X">`` is a GET without Origin or preflight: it
starts no on-demand engine and swaps no GPU group (503 ``model_not_running``); a POST
still does."""

from __future__ import annotations

import asyncio
import logging
import socket
from pathlib import Path
from typing import Any

import httpx
import pytest
from support.daemonkit import Running
from support.enginekit import free_port, write_config, write_preset
from support.gatewaykit import gateway_on, until

from lokid.core.config.tomlread import Checker, parse_toml
from lokid.core.errors import ConfigError
from lokid.core.names import MANAGER_INTERFACE, OBJECT_PATH
from lokid.core.serve.tables import parse_gateway
from lokid.gateway.hosts import Hosts, host_name

KEY = "client-key-hosts"


@pytest.fixture
def config(tmp_path: Path, engine: str, models: Any) -> Path:
    assert Path(models.llama).name == "llama.gguf"
    config = write_config(tmp_path, engine, [models.dir])
    write_preset(config, "lazy", f'model = "llama.gguf"\nctx = 2048\nport = {free_port()}\n'
                 "[serve]\non_demand = true\n")
    for name in ("alpha", "beta"):
        write_preset(config, name, f'model = "llama.gguf"\nctx = 2048\nport = {free_port()}\n'
                     '[serve]\non_demand = true\ngroup = "gpu0"\n')
    return config


def test_the_names_a_keyless_gateway_answers_to() -> None:
    hosts = Hosts(("llm.example.org", ".corp.example"))
    hosts.learn(["gpu1", "gpu1.lan."])
    for ok in ("127.0.0.1:8000", "127.0.0.2", "[::1]:8000", "192.0.2.7", "localhost",
               "LOCALHOST.:8000", "app.localhost:3000", "ip6-localhost", "gpu1", "gpu1.lan",
               "llm.example.org:443", "corp.example", "a.b.corp.example", None):
        assert hosts.allows(ok), ok
    for bad in ("attacker.example", "attacker.example:8000", "localhost.attacker.example",
                "gpu1.attacker.example", "example.org", "xcorp.example", "", "[::1",
                "[::1]x", "a b", "host:port", "ünicode.example", "127.0.0.1.nip.io"):
        assert not hosts.allows(bad), bad
    assert host_name("[::1]:80") == "::1" and host_name("Gpu1.:80") == "gpu1"
    assert Hosts(("*",)).allows("attacker.example")


def test_allowed_hosts_setting(tmp_path: Path) -> None:
    def parsed(text: str) -> Any:
        data = parse_toml(text, str(tmp_path / "lokid.toml"))["gateway"]
        return parse_gateway(Checker(str(tmp_path / "lokid.toml"), text, data, "gateway"))

    assert parsed('[gateway]\nallowed_hosts = ["llm.example.org", ".corp.example", "*"]'
                  ).allowed_hosts == ("llm.example.org", ".corp.example", "*")
    for bad in ("https://llm.example.org", "llm.example.org:8000", "a b", ".", ""):
        with pytest.raises(ConfigError, match="allowed_hosts.*not a host name"):
            parsed(f'[gateway]\nallowed_hosts = ["{bad}"]')


@pytest.mark.engine
@pytest.mark.slow
async def test_a_rebinding_page_is_refused_and_health_answers(
        running: Running, bus_address: str, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, "lokid.gateway")
    async with gateway_on(bus_address, allowed_hosts=("llm.example.org",)) as gw, \
            httpx.AsyncClient(base_url=gw.url, timeout=60) as c:  # type: ignore[attr-defined]
        port = gw.url.rsplit(":", 1)[1]  # type: ignore[attr-defined]
        for _ in range(12):
            r = await c.get("/v1/models", headers={"Host": f"attacker.example:{port}"})
            assert r.status_code == 421, r.text
            assert r.json()["error"]["code"] == "host_not_allowed"
            assert "localhost" in r.json()["error"]["message"]
        r = await c.get("/props?model=lazy", headers={"Host": "attacker.example"})
        assert r.status_code == 421
        r = await c.get("/health", headers={"Host": "attacker.example"})
        assert r.status_code == 200   # a load balancer's check names anything
        for name in (f"127.0.0.1:{port}", f"localhost:{port}", "llm.example.org",
                     f"{socket.gethostname()}:{port}"):
            r = await c.get("/v1/models", headers={"Host": name})
            assert r.status_code == 200 and r.json()["object"] == "list", name
        assert gw.presets.presets["lazy"].state == "inactive"
    lines = [r.getMessage() for r in caplog.records if "host_not_allowed" in r.getMessage()]
    assert 1 <= len(lines) <= 5, lines   # rate-limited (lokid.gateway.faults)
    assert "attacker.example" in lines[0] and "Traceback" not in caplog.text
    # with client keys a page is refused without one (401), and a client with one is served
    async with gateway_on(bus_address, keys=frozenset({KEY})) as gw, \
            httpx.AsyncClient(base_url=gw.url, timeout=60) as c:  # type: ignore[attr-defined]
        r = await c.get("/v1/models", headers={"Host": "attacker.example"})
        assert r.status_code == 401
        r = await c.get("/v1/models", headers={"Host": "llm.corp",
                                               "Authorization": f"Bearer {KEY}"})
        assert r.status_code == 200


def loads(running: Running, name: str) -> int:
    return sum(1 for ev in running.events if ev[0] == name and ev[1] == "loading")


@pytest.mark.engine
@pytest.mark.slow
async def test_a_get_starts_no_engine(running: Running, bus_address: str) -> None:
    async with gateway_on(bus_address) as gw, \
            httpx.AsyncClient(base_url=gw.url, timeout=120) as c:  # type: ignore[attr-defined]
        for _ in range(3):   # a page's <img src=".../props?model=lazy">, reloaded
            r = await c.get("/props?model=lazy")
            assert r.status_code == 503, r.text
            error = r.json()["error"]
            assert error["code"] == "model_not_running"
            assert "a GET does not start an engine" in error["message"]
        await asyncio.sleep(0.5)
        assert loads(running, "lazy") == 0
        assert running.daemon.engine_state("lazy").state == "inactive"
        r = await c.post("/completion", json={"model": "lazy", "prompt": "Hi", "n_predict": 1})
        assert r.status_code == 200, r.text   # a POST starts it, as before
        r = await c.get("/props?model=lazy")
        assert r.status_code == 200 and "model_path" not in r.json()
        assert loads(running, "lazy") == 1


@pytest.mark.engine
@pytest.mark.slow
async def test_a_get_swaps_no_gpu_group(running: Running, bus_address: str) -> None:
    manager = await running.iface(OBJECT_PATH, MANAGER_INTERFACE)
    await manager.call_start_preset("alpha")
    await running.wait_event("alpha", "ready")
    async with gateway_on(bus_address) as gw, \
            httpx.AsyncClient(base_url=gw.url, timeout=120) as c:  # type: ignore[attr-defined]
        async def ready() -> bool:
            return gw.presets.presets["alpha"].state == "ready"

        await until(ready, 10, "alpha ready in the gateway")
        events = len(running.events)
        r = await c.get("/props?model=alpha")   # the holder's GET is served
        assert r.status_code == 200, r.text
        for _ in range(3):
            r = await c.get("/props?model=beta")
            assert r.status_code == 503 and r.json()["error"]["code"] == "model_not_running"
        await asyncio.sleep(0.5)
        assert running.events[events:] == []   # nothing stopped, nothing started
        assert running.daemon.engine_state("alpha").state == "ready"
        assert running.daemon.engine_state("beta").state == "inactive"
        assert all(g.swaps == 0 for g in gw.groups.groups.values())
