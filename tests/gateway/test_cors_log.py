"""A page's origin refused is said in the gateway's log (issue 48, item 2), against the
real gateway and the real daemon on a private bus: desktop and webview clients send
``Origin: vscode-webview://…``, ``app://…`` or ``null``, and their 403 was answered by the
CORS middleware with no line at all. Each refusal is now one line naming the origin
(escaped, cut) and the setting that allows it, rate-limited as every refusal."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Any

import httpx
import pytest
from support.daemonkit import Running
from support.enginekit import free_port, write_config, write_preset
from support.gatewaykit import gateway_on

from lokid.gateway.faults import LINES_PER_WINDOW

pytestmark = [pytest.mark.engine]

FLOOD = 1000


@pytest.fixture
def config(tmp_path: Path, engine: str, models: Any) -> Path:
    assert Path(models.llama).name == "llama.gguf"
    config = write_config(tmp_path, engine, [models.dir])
    write_preset(config, "alpha", f'model = "llama.gguf"\nctx = 2048\nport = {free_port()}\n')
    return config


def refusals(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records
            if r.name == "lokid.gateway" and "origin_not_allowed" in r.getMessage()]


async def test_a_refused_origin_is_logged_with_the_setting_and_a_flood_is_bounded(
        running: Running, bus_address: str, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, "lokid.gateway")
    async with gateway_on(bus_address, cors_origins=("https://chat.example.org",)) as gw, \
            httpx.AsyncClient(base_url=gw.url, timeout=60) as c:  # type: ignore[attr-defined]
        # one window for the whole test: its count does not depend on how long it runs
        gw.cors.faults.throttle.window = 3600.0
        body = {"model": "alpha", "messages": [{"role": "user", "content": "Hi"}]}
        for origin in ("vscode-webview://x", "null"):
            r = await c.post("/v1/chat/completions", json=body, headers={"Origin": origin})
            assert r.status_code == 403 and r.json()["error"]["code"] == "origin_not_allowed"
            line = refusals(caplog)[-1]
            assert f"a page at origin {origin}: allow it in lokid.toml's [gateway] " \
                   "cors_origins" in line and "POST /v1/chat/completions: 403" in line, line
        # what the client chose is cut and escaped: a long origin, a line break in the path
        r = await c.get("/v1/models%0Aforged", headers={"Origin": "app://" + "a" * 500})
        assert r.status_code == 403
        line = refusals(caplog)[-1]
        assert "app://" + "a" * 74 + "..." in line and "a" * 75 not in line, line
        assert "\n" not in line and "/v1/models\\u000aforged" in line, line
        assert len(refusals(caplog)) == 3 and gw.presets.presets["alpha"].state == "inactive"

        async def flood(n: int) -> None:
            for _ in range(n):
                r = await c.get("/v1/models", headers={"Origin": "app://flood"})
                assert r.status_code == 403
        await asyncio.gather(*(flood(FLOOD // 10) for _ in range(10)))
        assert len(refusals(caplog)) == LINES_PER_WINDOW   # 1,003 refusals, 5 lines
        # the next window's first line says how many were not written
        gw.cors.faults.throttle.window = 0.0
        r = await c.get("/v1/models", headers={"Origin": "app://after"})
        assert r.status_code == 403
        held = 3 + FLOOD - LINES_PER_WINDOW
        assert refusals(caplog)[-1].endswith(f"({held} more like it not logged)"), \
            refusals(caplog)[-1]
        assert "a page at origin app://after" in refusals(caplog)[-1]
