"""``lokictl unload`` of a preset that clients keep using through the gateway: the real
daemon (local runner), engine and gateway on a private bus.

Before the preset's ``Unloading`` property, the gateway kept sending new requests to the
engine being unloaded: its drain rarely saw 0 requests in flight, and a request that
came during the stop started the engine again, so the unload's job waited for an
inactive engine that never came (10 minutes in the fleet's rolling upgrade). Now the
gateway holds new requests while the unload runs, and lets them go once it ended: an
on-demand preset starts again for them, one that is not on demand answers how to start
it. No request is cut or fails in between."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from support.daemonkit import Running
from support.enginekit import free_port, write_config, write_preset

from lokid.core.names import MANAGER_INTERFACE, OBJECT_PATH
from lokid.gateway.server import Gateway

pytestmark = [pytest.mark.engine, pytest.mark.slow]

CLIENTS = 4


@pytest.fixture
def config(tmp_path: Path, engine: str, models: Any) -> Path:
    assert Path(models.llama).name == "llama.gguf"   # written on first use
    config = write_config(tmp_path, engine, [models.dir])
    write_preset(config, "lazy", f'model = "llama.gguf"\nctx = 2048\nport = {free_port()}\n'
                 "[serve]\non_demand = true\n")
    write_preset(config, "held", f'model = "llama.gguf"\nctx = 2048\nport = {free_port()}\n')
    return config


def chat(model: str) -> dict[str, Any]:
    return {"model": model, "messages": [{"role": "user", "content": "Hello"}],
            "max_tokens": 8, "temperature": 0}


def lokictl(address: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "lokid.ctl", "--address", address, *args],
                          capture_output=True, text=True, timeout=120)


async def steady(c: httpx.AsyncClient, model: str, until: asyncio.Event,
                 codes: list[tuple[int, str]]) -> None:
    """Requests one after another until ``until`` is set: each (status, error code)."""
    while not until.is_set():
        r = await c.post("/v1/chat/completions", json=chat(model))
        codes.append((r.status_code, r.json().get("error", {}).get("code", "")
                      if r.status_code != 200 else ""))


async def unload_under_load(running: Running, gateway: Gateway, bus_address: str,
                            model: str) -> tuple[subprocess.CompletedProcess[str],
                                                 list[tuple[int, str]], bool]:
    """``model`` started, then ``lokictl unload`` while CLIENTS clients keep asking for
    it: lokictl's result, every answer, and whether the gateway saw it unloading."""
    manager = await running.iface(OBJECT_PATH, MANAGER_INTERFACE)
    await manager.call_start_preset(model)
    await running.wait_event(model, "ready")
    codes: list[tuple[int, str]] = []
    stop = asyncio.Event()
    seen_unloading = False

    async def watch() -> None:
        nonlocal seen_unloading
        while not stop.is_set():
            seen_unloading |= gateway.presets.presets[model].unloading
            await asyncio.sleep(0.01)

    async with httpx.AsyncClient(base_url=gateway.url, timeout=120) as c:  # type: ignore[attr-defined]
        clients = [asyncio.ensure_future(steady(c, model, stop, codes)) for _ in range(CLIENTS)]
        watcher = asyncio.ensure_future(watch())
        deadline = time.monotonic() + 60
        while sum(1 for code, _ in codes if code == 200) < 20:
            assert time.monotonic() < deadline and not any(t.done() for t in clients), codes
            await asyncio.sleep(0.05)
        r = await asyncio.to_thread(lokictl, bus_address, "unload", model, "--timeout", "90")
        await asyncio.sleep(1.0)   # the clients go on a while after the unload
        stop.set()
        await asyncio.gather(*clients, watcher)
    return r, codes, seen_unloading


async def test_an_on_demand_preset_in_use_unloads_then_starts_again_for_its_clients(
        running: Running, gateway: Gateway, bus_address: str) -> None:
    r, codes, seen = await unload_under_load(running, gateway, bus_address, "lazy")
    assert r.returncode == 0, r
    assert r.stdout.startswith("lazy: inactive (") and r.stdout.rstrip().endswith(
        "then stopped)"), r.stdout
    assert seen, "the gateway never saw the preset unloading"
    assert {code for code, _ in codes} == {200}, [c for c in codes if c[0] != 200][:5]
    # stopped once by the unload, started again by the requests that waited for its end
    states = [e[1] for e in running.events if e[0] == "lazy"]
    assert states.count("inactive") >= 1 and states[-1] == "ready", states
    assert not gateway.presets.presets["lazy"].unloading


async def test_a_preset_not_on_demand_unloads_and_its_next_requests_say_how_to_start_it(
        running: Running, gateway: Gateway, bus_address: str) -> None:
    r, codes, seen = await unload_under_load(running, gateway, bus_address, "held")
    assert r.returncode == 0, r
    assert seen
    assert set(codes) <= {(200, ""), (503, "model_not_running")}, \
        [c for c in codes if c[0] != 200][:5]
    assert (503, "model_not_running") in codes   # the clients went on after the unload
    assert [e[1] for e in running.events if e[0] == "held"][-1] == "inactive"
