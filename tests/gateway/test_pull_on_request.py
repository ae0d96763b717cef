"""A request for an on-demand preset whose model is a hub reference not pulled yet (issue
48): the gateway starts it as any cold start, the start pulls the model first, and the
request is answered once the engine is up: the README's ten-minute path. The real daemon
(local runner) on a private bus, the real engine, the gateway in the test's loop, the
hub's stand-in (:mod:`support.hubstand`) serving a real GGUF slowly enough that the
request waits for the pull."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import httpx
import pytest
from support.daemonkit import Running
from support.enginekit import free_port, write_config, write_preset
from support.gatewaykit import gateway_on
from support.hubstand import hub_running, requests_log, set_faults
from support.models import write_llama

from lokid.gateway.server import Gateway

pytestmark = [pytest.mark.engine]


@pytest.fixture
def hub(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    repo = tmp_path / "hub" / "org" / "chat-GGUF"
    repo.mkdir(parents=True)
    write_llama(repo / "chat-Q4_K_M.gguf")
    with hub_running(tmp_path / "hub") as base:
        set_faults(base, slow=20)   # the pull takes a moment: the request waits for it
        monkeypatch.setenv("HF_ENDPOINT", base)   # the daemon's, its engine steps' too
        yield base


@pytest.fixture
def config(tmp_path: Path, engine: str, hub: str) -> Path:
    models = tmp_path / "models"
    models.mkdir()
    config = write_config(tmp_path, engine, [models])
    write_preset(config, "chat", f'model = "org/chat-GGUF:Q4_K_M"\nctx = 2048\n'
                 f'port = {free_port()}\n[serve]\non_demand = true\n')
    return config


@pytest.fixture
async def gateway(running: Running, bus_address: str) -> AsyncIterator[Gateway]:
    async with gateway_on(bus_address) as g:
        yield g


async def test_the_first_request_pulls_the_model_and_is_answered(
        gateway: Gateway, hub: str, tmp_path: Path) -> None:
    async with httpx.AsyncClient(base_url=gateway.url, timeout=120) as c:  # type: ignore[attr-defined]
        listed = (await c.get("/v1/models")).json()
        assert [m["id"] for m in listed["data"]] == ["chat"]   # listed before its pull
        r = await c.post("/v1/chat/completions", json={
            "model": "chat", "max_tokens": 4, "temperature": 0,
            "messages": [{"role": "user", "content": "Hello?"}]})
        assert r.status_code == 200, r.text
        assert r.json()["choices"][0]["message"]["content"] is not None
    assert (tmp_path / "models" / "chat-Q4_K_M.gguf").is_file()
    assert [e for e in requests_log(hub) if "/_cdn/" in e["path"]]   # fetched, not found
