"""An embedding preset's requests are not taken for an unreadable engine log (issue 48,
item 4): the real daemon on a private bus (its local runner) and the real llama-server
started with ``--embeddings``. Its embeddings print no timing line; three of them made
the daemon warn "the engine's log format may have changed, its Stats are blind"."""

from __future__ import annotations

import asyncio
import logging
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from support.daemonkit import Running
from support.enginekit import free_port, write_config, write_preset

from lokid.core.names import MANAGER_INTERFACE, OBJECT_PATH, PRESET_INTERFACE, preset_object_path

pytestmark = [pytest.mark.engine, pytest.mark.slow]


@pytest.fixture
def port() -> int:
    return free_port()


@pytest.fixture
def config(tmp_path: Path, engine: str, models: Any, port: int) -> Path:
    config = write_config(tmp_path, engine, [models.dir])
    assert Path(models.llama).name == "llama.gguf"
    write_preset(config, "emb", f'model = "llama.gguf"\nctx = 2048\nport = {port}\n'
                 'extra_args = ["--embeddings", "--pooling", "mean"]\n')
    return config


async def test_embeddings_do_not_make_the_stats_blind_warning(
        running: Running, port: int, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, "lokid")
    manager = await running.iface(OBJECT_PATH, MANAGER_INTERFACE)
    preset = await running.iface(preset_object_path("emb"), PRESET_INTERFACE)
    await manager.call_start_preset("emb")
    await running.wait_event("emb", "ready")
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=120) as c:
        for text in ("one", "two", "three", "four"):
            r = await c.post("/v1/embeddings", json={"input": f"words {text}"})
            assert r.status_code == 200 and r.json()["data"][0]["embedding"], r.text
        # then a completion, on the same engine: its figures are read, and its Stats
        # come in a tick after the one that warned of the embeddings before the fix
        r = await c.post("/completion", json={"prompt": "Hi", "n_predict": 2})
        assert r.status_code == 200, r.text
    deadline = time.monotonic() + 30
    while (stats := await preset.get_stats())["requests"].value != 1:
        assert time.monotonic() < deadline, stats
        await asyncio.sleep(0.1)
    # the flag the warning is written from (at the telemetry's next tick), and the warning
    meters = running.daemon.telemetry.meters
    start = meters.starts["emb"]
    assert not start.blind and meters.blind == [] and "Stats are blind" not in caplog.text
    assert start.launched == 5 and start.log.untimed == 4   # the embeddings were seen
    await manager.call_stop_preset("emb")
    await running.wait_event("emb", "inactive")
