"""Issue 29, item 5, through the gateway: a start that fails out of memory is not
started again into the same room, and after the failure with all the room the preset
is refused at once with the figures.

The real daemon (local runner), gateway and engine; the engine's wrapper limits its
address space (``ulimit -v``), so the KV cache of ``big`` (``ctx = 1000000``: 488 MiB)
cannot be allocated while the small preset ``s`` serves (tests/dbus/test_daemon_oom.py
says what the engine prints). ``[placement] host_memory = 2G``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest
from support.daemonkit import Running
from support.enginekit import free_port, write_config, write_preset
from support.gatewaykit import until

from lokid.core.place.footprint import OOM
from lokid.gateway.server import Gateway

pytestmark = [pytest.mark.engine, pytest.mark.slow]

GiB = 2**30


@pytest.fixture
def config(tmp_path: Path, engine: str, models: Any) -> Path:
    assert Path(models.llama).name == "llama.gguf"   # written on first use
    wrapper = tmp_path / "bin" / "llama-server"
    wrapper.parent.mkdir()
    wrapper.write_text(f"#!/bin/sh\nulimit -v 600000\nexec {engine} \"$@\"\n")
    wrapper.chmod(0o755)
    config = write_config(tmp_path, str(wrapper), [models.dir])
    toml = config / "lokid.toml"
    toml.write_text(toml.read_text() + '[placement]\nhost_memory = "2G"\n')
    write_preset(config, "big", f'model = "llama.gguf"\nctx = 1000000\nport = {free_port()}\n'
                 'extra_args = ["-np", "1"]\n[serve]\non_demand = true\n')
    write_preset(config, "s", f'model = "llama.gguf"\nctx = 512\nport = {free_port()}\n'
                 "[serve]\non_demand = true\n")
    return config


def chat(model: str) -> dict[str, Any]:
    return {"model": model, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}


def starts(running: Running, name: str) -> int:
    return sum(1 for ev in running.events if ev[0] == name and ev[1] == "loading"
               and "restarting" not in ev[2])


async def test_an_out_of_memory_start_is_placed_anew_then_refused(
        running: Running, gateway: Gateway) -> None:
    registry = running.daemon.registry
    async with httpx.AsyncClient(base_url=gateway.url, timeout=120) as c:  # type: ignore[attr-defined]
        assert (await c.post("/v1/chat/completions", json=chat("s"))).status_code == 200
        r = await c.post("/v1/chat/completions", json=chat("big"))
        assert r.status_code == 503 and r.json()["error"]["code"] == "model_start_failed"
        # how it ran out of memory (the daemon's reading of the engine's lines) and the
        # engine's own words (its job's end), not the load's last progress line
        message = r.json()["error"]["message"]
        assert message.startswith("preset 'big' failed to start: out of memory (host: an "
                                  "allocation of 488 MiB failed, "), r.text
        assert "the engine said: " in message and "loading big" not in message, r.text

        async def raised() -> bool:
            f = registry.presets["big"].footprint
            return f is not None and f.sources.get("host") == OOM \
                and gateway.presets.presets["big"].memory.get("sources", {}).get("host") == OOM
        await until(raised, 30, "big's record raised, and the gateway told")
        # its restart was cancelled: one start so far, and none running
        await until(lambda: _inactive(running, "big"), 30, "big stopped")
        assert starts(running, "big") == 1
        # raised to what the host had free (2 GiB less s's need), bounded: the next
        # start is placed by it, s evicted first, and it fails with all the room
        r = await c.post("/v1/chat/completions", json=chat("big"))
        assert r.status_code == 503 and r.json()["error"]["code"] == "model_start_failed"
        assert starts(running, "big") == 2, running.events
        # (before the fix: the first start's grant, never settled between two requests,
        # let the second start skip the placement and run beside s)
        assert gateway.placer.evictions[("s", "room")] == 1

        async def never() -> bool:
            return "does_not_fit" in gateway.presets.presets["big"].memory
        await until(never, 30, "big never fits now")
        for _ in range(2):   # at once, with the figures, and never started again
            r = await c.post("/v1/chat/completions", json=chat("big"))
            error = r.json()["error"]
            assert r.status_code == 503 and error["code"] == "model_does_not_fit", r.text
            assert error["message"].startswith("preset 'big' needs 2.")
            assert error["message"].endswith("GiB on host; it has 2.0 GiB")
        assert starts(running, "big") == 2
        # the others are not held by it
        assert (await c.post("/v1/chat/completions", json=chat("s"))).status_code == 200


async def _inactive(running: Running, name: str) -> bool:
    return running.daemon.runner.state(name).state == "inactive"
