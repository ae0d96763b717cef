"""An external preset through the gate (issue 46, item 4): an API elsewhere has no slots
here, so only a key's ``max_in_flight`` holds its requests; another key's are sent at
once. The API is a real aiohttp server on loopback that holds each request until the
test lets it answer, and counts how many it holds at once; the daemon lists the preset
(its local runner, a private bus), the gateway reads the named keys from a file."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from support.enginekit import write_config, write_preset
from support.gatewaykit import app_on_loopback, gateway_on, until

from lokid.core.serve.keys import digest

pytestmark = [pytest.mark.engine, pytest.mark.slow]

KEYS = {"one": "sk-loki-one-000000000000000000000000000000000",
        "free": "sk-loki-free-00000000000000000000000000000000"}


class Held:
    def __init__(self) -> None:
        self.now = 0
        self.most = 0
        self.go = asyncio.Event()


@pytest.fixture
async def api() -> AsyncIterator[tuple[str, Held]]:
    from aiohttp import web

    held = Held()

    async def chat(request: web.Request) -> web.Response:
        body = await request.json()
        held.now += 1
        held.most = max(held.most, held.now)
        try:
            await held.go.wait()
        finally:
            held.now -= 1
        return web.json_response({"id": "r", "object": "chat.completion", "created": 0,
                                  "model": body["model"], "choices": [{
                                      "index": 0, "finish_reason": "stop", "message": {
                                          "role": "assistant", "content": "ok"}}]})

    app = web.Application()
    app.router.add_post("/v1/chat/completions", chat)
    async with app_on_loopback(app) as url:
        yield f"{url}/v1", held


@pytest.fixture
def config(tmp_path: Path, engine: str, models: Any, api: tuple[str, Held]) -> Path:
    config = write_config(tmp_path, engine, [models.dir])
    write_preset(config, "remote", f'kind = "external"\nurl = "{api[0]}"\n')
    return config


@pytest.fixture
def keys_file(tmp_path: Path) -> Path:
    path = tmp_path / "keys.toml"
    path.write_text(f'[keys.one]\nhash = "{digest(KEYS["one"])}"\nmax_in_flight = 1\n'
                    f'[keys.free]\nhash = "{digest(KEYS["free"])}"\n')
    return path


async def ask(c: httpx.AsyncClient, key: str) -> httpx.Response:
    return await c.post("/v1/chat/completions", headers={"Authorization": f"Bearer {KEYS[key]}"},
                        json={"model": "remote", "messages": [{"role": "user", "content": "x"}]})


async def test_only_a_keys_max_in_flight_holds_an_external_preset(
        running: Any, bus_address: str, keys_file: Path, api: tuple[str, Held]) -> None:
    held = api[1]
    async with gateway_on(bus_address, keys_file=str(keys_file)) as gw, \
            httpx.AsyncClient(base_url=gw.url, timeout=60) as c:  # type: ignore[attr-defined]
        await until(lambda: _true("remote" in gw.presets.presets), 30, "the preset listed")
        ones = [asyncio.create_task(ask(c, "one")) for _ in range(3)]
        frees = [asyncio.create_task(ask(c, "free")) for _ in range(4)]
        await until(lambda: _true(held.now == 5), 30, "5 requests at the API")
        assert gw.admission.waiting() == {"remote": 2}   # "one"'s two others, held here
        await asyncio.sleep(0.3)   # nothing more reaches the API while they are held
        assert held.now == 5
        held.go.set()
        answers = await asyncio.gather(*ones, *frees)
        assert [r.status_code for r in answers] == [200] * 7
        assert held.most == 5   # 4 of "free" at once, 1 of "one"
        assert gw.admission.share.running("remote") == 0


async def _true(value: bool) -> bool:
    return value
