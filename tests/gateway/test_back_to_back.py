"""Streams back to back through the gateway, with the real engine under the daemon's
local runner: llama-server closes its side of a connection after a stream, a moment
after the last byte, so a connection aiohttp pooled at the stream's end could be handed
to the next request and fail it (502 for ~1 stream in 8 here, before the relay stopped
pooling them and sent a request on a closed connection once more)."""

from __future__ import annotations

import asyncio
from collections import Counter
from pathlib import Path
from typing import Any

import httpx
import pytest
from support.enginekit import write_config, write_preset

from lokid.gateway.server import Gateway

pytestmark = [pytest.mark.engine, pytest.mark.slow]

CLIENTS, EACH = 16, 20


@pytest.fixture
def config(tmp_path: Path, engine: str, models: Any, ports: dict[str, int]) -> Path:
    assert Path(models.llama).name == "llama.gguf"
    config = write_config(tmp_path, engine, [models.dir])
    write_preset(config, "alpha", f'model = "llama.gguf"\nctx = 4096\nport = {ports["alpha"]}\n'
                 'extra_args = ["-np", "16"]\n[serve]\non_demand = true\n')
    return config


async def test_streams_back_to_back_are_all_answered(running: Any, gateway: Gateway) -> None:
    statuses: Counter[int] = Counter()
    errors: list[str] = []

    async def client(c: httpx.AsyncClient) -> None:
        for _ in range(EACH):
            async with c.stream("POST", "/v1/chat/completions", json={
                    "model": "alpha", "messages": [{"role": "user", "content": "Hi"}],
                    "max_tokens": 4, "stream": True}) as r:
                body = await r.aread()
                statuses[r.status_code] += 1
                if r.status_code != 200:
                    errors.append(body.decode(errors="replace")[:200])

    limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
    async with httpx.AsyncClient(base_url=gateway.url, timeout=60,  # type: ignore[attr-defined]
                                 limits=limits) as c:
        r = await c.post("/v1/completions", json={"model": "alpha", "prompt": "Hi",
                                                  "max_tokens": 1})   # its start
        assert r.status_code == 200, r.text
        await asyncio.gather(*(client(c) for _ in range(CLIENTS)))
    assert statuses == {200: CLIENTS * EACH}, (statuses, errors[:3])
