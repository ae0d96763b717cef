"""A preset split with RPC workers, as the daemon's Memory shows it to the gateway's
placement (issue 30, item 2): the GGUF estimate counts every layer on this host, where
the engine puts some on the workers, so before its first load is measured its need is
unknown ({}), never a figure that would hold its start back or evict other engines for
it. The same preset without workers has its estimate. The real daemon (local runner) on
a private dbus-daemon; no worker needs to run (Memory probes nothing)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from support.daemonkit import Running
from support.enginekit import free_port, write_config, write_preset

from lokid.core.names import PRESET_INTERFACE
from lokid.core.names import preset_object_path as path_of
from lokid.host.buscall import plain

pytestmark = [pytest.mark.engine]


@pytest.fixture
def config(tmp_path: Path, engine: str, models: Any) -> Path:
    assert Path(models.llama).name == "llama.gguf"   # written on first use
    config = write_config(tmp_path, engine, [models.dir])
    write_preset(config, "alone", f'model = "llama.gguf"\nctx = 2048\nport = {free_port()}\n')
    write_preset(config, "split", f'model = "llama.gguf"\nctx = 2048\nport = {free_port()}\n'
                 f'rpc = ["127.0.0.1:{free_port()}"]\n')
    return config


async def test_a_split_presets_need_is_unknown_until_measured(running: Running) -> None:
    alone = await running.iface(path_of("alone"), PRESET_INTERFACE)
    split = await running.iface(path_of("split"), PRESET_INTERFACE)
    memory = plain(await alone.get_memory())
    assert memory["sources"] == {"host": "estimate"} and memory["needs"]["host"] > 0, memory
    assert plain(await split.get_memory()) == {}
