"""Where the daemon tells the gateway an engine answers (the ``url`` of a preset's Stats,
which lokid.gateway.presets mirrors): the running start's address while one runs, the
next start's plan otherwise.

The real daemon (local runner) and the real engine on a private real dbus-daemon, read
through the gateway's own mirror of the presets. The URL used to be the plan's alone: a
port edited while the engine ran sent the gateway's requests to the new port, where
nothing listened until a restart. The preset whose start pulls its model (no plan, so no
address, until the pull ends) is tests/dbus/test_pull_first.py's.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from support.daemonkit import Running
from support.enginekit import free_port, write_config, write_preset

from lokid.core.names import MANAGER_INTERFACE, OBJECT_PATH, PRESET_INTERFACE, preset_object_path
from lokid.gateway.presets import Presets

pytestmark = pytest.mark.engine


@pytest.fixture
def ports() -> dict[str, int]:
    return {"before": free_port(), "after": free_port()}


@pytest.fixture
def config(tmp_path: Path, engine: str, models: Any, ports: dict[str, int]) -> Path:
    config = write_config(tmp_path, engine, [models.dir])
    assert Path(models.llama).name == "llama.gguf"   # made on first use
    write_preset(config, "chat", f'model = "llama.gguf"\nctx = 512\nport = {ports["before"]}\n')
    return config


async def until(what: str, check: Any, timeout: float = 10) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not check():
        assert asyncio.get_running_loop().time() < deadline, what
        await asyncio.sleep(0.05)


async def test_a_port_edited_while_the_engine_runs_is_not_where_requests_go(
        running: Running, config: Path, ports: dict[str, int]) -> None:
    seen = Presets(running.client)
    await seen.attach()
    chat = seen.presets["chat"]
    before, after = (f"http://127.0.0.1:{ports[k]}" for k in ("before", "after"))
    manager = await running.iface(OBJECT_PATH, MANAGER_INTERFACE)
    await manager.call_start_preset("chat")
    await running.wait_event("chat", "ready", timeout=120)
    await until("the gateway sees the engine ready at its port",
                lambda: chat.state == "ready" and chat.url == before)
    write_preset(config, "chat", f'model = "llama.gguf"\nctx = 512\nport = {ports["after"]}\n')
    await manager.call_reload()
    preset = await running.iface(preset_object_path("chat"), PRESET_INTERFACE)
    assert await preset.get_pending_restart()   # the edit waits for a restart
    await seen.read()   # as the gateway does after a reload
    assert (chat.state, chat.url) == ("ready", before)
    stats = await preset.get_stats()
    assert stats["url"].value == before, stats
    # the restart runs the edit: the engine answers at the new port, and the gateway goes there
    await manager.call_restart_preset("chat")
    await until("the gateway follows the restarted engine to its new port",
                lambda: chat.state == "ready" and chat.url == after, 120)
    await manager.call_stop_preset("chat")
    await running.wait_event("chat", "inactive")
    # stopped: the next start's address
    await until("a stopped preset's URL is its next start's", lambda: chat.url == after)
