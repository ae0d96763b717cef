"""An external preset's alias (issue 46, item 5), through the real daemon and gateway, the
API elsewhere a real aiohttp server that records what it is sent: a request by the alias
reaches the API asking for the preset's upstream_model, and the answer names the preset."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from support.daemonkit import Running
from support.enginekit import write_config, write_preset
from support.gatewaykit import app_on_loopback

from lokid.gateway.server import Gateway

pytestmark = [pytest.mark.engine, pytest.mark.slow]


@pytest.fixture
async def api() -> AsyncIterator[tuple[str, list[dict[str, Any]]]]:
    from aiohttp import web

    seen: list[dict[str, Any]] = []

    async def chat(request: web.Request) -> web.Response:
        body = await request.json()
        seen.append(body)
        return web.json_response({"id": "r1", "object": "chat.completion", "created": 0,
                                  "model": body["model"], "choices": [{
                                      "index": 0, "finish_reason": "stop", "message": {
                                          "role": "assistant", "content": "elsewhere"}}]})

    app = web.Application()
    app.router.add_post("/v1/chat/completions", chat)
    async with app_on_loopback(app) as url:
        yield f"{url}/v1", seen


@pytest.fixture
def config(tmp_path: Path, engine: str, api: tuple[str, list[dict[str, Any]]]) -> Path:
    config = write_config(tmp_path, engine, [tmp_path])
    write_preset(config, "remote", f'kind = "external"\nurl = "{api[0]}"\n'
                 'upstream_model = "up-model"\naliases = ["gpt-4o"]\n')
    return config


async def test_an_external_presets_alias_asks_its_api_for_its_upstream_model(
        running: Running, gateway: Gateway, api: tuple[str, list[dict[str, Any]]]) -> None:
    _, seen = api
    async with httpx.AsyncClient(base_url=gateway.url, timeout=60) as c:  # type: ignore[attr-defined]
        models = {m["id"]: m for m in (await c.get("/v1/models")).json()["data"]}
        assert models["gpt-4o"]["lokid"]["alias_of"] == "remote"
        assert models["gpt-4o"]["lokid"]["state"] == "external"
        assert models["remote"]["aliases"] == ["gpt-4o"]
        r = await c.post("/v1/chat/completions", json={
            "model": "gpt-4o", "messages": [{"role": "user", "content": "Hi"}]})
    assert r.status_code == 200, r.text
    assert [b["model"] for b in seen] == ["up-model"]
    assert r.json()["model"] == "remote"
