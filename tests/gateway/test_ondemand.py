"""A request starting its preset: the real daemon (local runner) and engine on a private bus.

Requests arriving together for a stopped on-demand preset share one start; a start that
fails answers every request with the preset's reason, and the next requests too, without
starting it again."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from dbus_fast import DBusError
from support.daemonkit import Running
from support.enginekit import free_port, write_config, write_preset

from lokid.core.names import MANAGER_INTERFACE, OBJECT_PATH
from lokid.gateway.server import Gateway
from lokid.runners import local_runner

pytestmark = [pytest.mark.engine, pytest.mark.slow]


@pytest.fixture
def busy_port() -> Iterator[int]:
    """A port something else listens on: the preset's start fails (the port check)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(1)
        yield int(s.getsockname()[1])


@pytest.fixture
def config(tmp_path: Path, engine: str, models: Any, busy_port: int) -> Path:
    assert Path(models.llama).name == "llama.gguf"
    config = write_config(tmp_path, engine, [models.dir])
    write_preset(config, "lazy", f'model = "llama.gguf"\nctx = 2048\nport = {free_port()}\n'
                 "[serve]\non_demand = true\n")
    write_preset(config, "blocked", f'model = "llama.gguf"\nctx = 2048\nport = {busy_port}\n'
                 "[serve]\non_demand = true\n")
    # 512 bytes of KV per token and 2 KiB of compute (ubatch 512 × 2 × f16 mask): 32768
    # tokens are some 80 MiB with the engine's own, beyond what lokid's engines may hold
    # on this host here (the others need about 29 MiB each)
    write_preset(config, "huge", f'model = "llama.gguf"\nctx = 32768\nport = {free_port()}\n'
                 "[serve]\non_demand = true\n")
    toml = config / "lokid.toml"
    toml.write_text(toml.read_text() + '[placement]\nhost_memory = "40M"\n')
    return config


def chat(model: str) -> dict[str, Any]:
    return {"model": model, "messages": [{"role": "user", "content": "Hello"}],
            "max_tokens": 4, "temperature": 0}


def starts(running: Running, name: str) -> int:
    return sum(1 for ev in running.events if ev[0] == name and ev[1] == "loading")


async def test_the_first_requests_start_the_preset_once(running: Running,
                                                        gateway: Gateway) -> None:
    async with httpx.AsyncClient(base_url=gateway.url, timeout=120) as c:  # type: ignore[attr-defined]
        listed = {m["id"]: m["lokid"] for m in (await c.get("/v1/models")).json()["data"]}
        assert listed["lazy"]["on_demand"] is True and listed["lazy"]["state"] == "inactive"
        replies = await asyncio.gather(*(c.post("/v1/chat/completions", json=chat("lazy"))
                                         for _ in range(4)))
        assert [r.status_code for r in replies] == [200] * 4, replies[0].text
        assert all(r.json()["model"] == "lazy" for r in replies)
        assert starts(running, "lazy") == 1
        # ready now: the next request is relayed at once
        assert (await c.post("/v1/chat/completions", json=chat("lazy"))).status_code == 200
        assert starts(running, "lazy") == 1
        listed = {m["id"]: m["lokid"] for m in (await c.get("/v1/models")).json()["data"]}
        assert listed["lazy"]["state"] == "ready"


async def test_a_failed_start_answers_its_reason_without_a_retry_storm(
        running: Running, gateway: Gateway, monkeypatch: pytest.MonkeyPatch,
        busy_port: int) -> None:
    monkeypatch.setattr(local_runner, "RESTART_SEC", 0.1)
    async with httpx.AsyncClient(base_url=gateway.url, timeout=120) as c:  # type: ignore[attr-defined]
        replies = await asyncio.gather(*(c.post("/completion", json={"model": "blocked",
                                                                     "prompt": "x"})
                                         for _ in range(3)))
        for r in replies:
            error = r.json()["error"]
            assert r.status_code == 503 and error["code"] == "model_start_failed"
            assert str(busy_port) in error["message"], error
        tried = starts(running, "blocked")
        assert tried >= 1
        for _ in range(5):   # a client retrying in a loop
            r = await c.post("/completion", json={"model": "blocked", "prompt": "x"})
            assert r.status_code == 503 and str(busy_port) in r.json()["error"]["message"]
        await asyncio.sleep(0.5)
        assert starts(running, "blocked") == tried


async def test_a_preset_this_host_can_never_hold_is_refused_at_once(
        running: Running, gateway: Gateway) -> None:
    """Issue 29: refused with the figures, never started to fail out of memory: by the
    gateway's placement at once, and by the daemon's StartForRequest."""
    async with httpx.AsyncClient(base_url=gateway.url, timeout=120) as c:  # type: ignore[attr-defined]
        for _ in range(3):
            r = await c.post("/v1/chat/completions", json=chat("huge"))
            error = r.json()["error"]
            assert r.status_code == 503 and error["code"] == "model_does_not_fit", r.text
            assert error["message"].startswith("preset 'huge' needs ")
            assert error["message"].endswith(" MiB on host; it has 40 MiB")
        assert starts(running, "huge") == 0
        # the daemon refuses it too, for a gateway that does not place (or an older one)
        manager = await running.iface(OBJECT_PATH, MANAGER_INTERFACE)
        with pytest.raises(DBusError) as e:
            await manager.call_start_for_request("huge")
        assert e.value.type == "org.lokid.Lokid1.Error.InvalidPreset"
        assert "MiB on host; it has 40 MiB: it is not started" in e.value.text
        assert starts(running, "huge") == 0
        # the others still start: the refusal is the preset's, not the host's
        assert (await c.post("/v1/chat/completions", json=chat("lazy"))).status_code == 200
