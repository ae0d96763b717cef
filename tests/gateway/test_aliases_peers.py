"""Aliases across peers (issue 46, item 5), through the real daemon, gateway and engine and
a peer that is a real HTTP server of its own (tests/support/lyingpeer.py): a peer's alias
is listed with what it is an alias of; a peer listing a model named like a local alias
loses it to the local preset, the clash named in /v1/models and its requests answered
here."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from support.daemonkit import Running
from support.enginekit import free_port, write_config, write_preset
from support.gatewaykit import gateway_on, until
from support.lyingpeer import LyingPeer, lying_peer

from lokid.core.fleet.peers import Peer
from lokid.gateway import peers as peers_mod
from lokid.gateway.server import Gateway

pytestmark = [pytest.mark.engine, pytest.mark.slow]


@pytest.fixture
def config(tmp_path: Path, engine: str, models: Any) -> Path:
    config = write_config(tmp_path, engine, [models.dir])
    assert Path(models.llama).name == "llama.gguf"
    write_preset(config, "qwen", f'model = "llama.gguf"\nctx = 2048\nport = {free_port()}\n'
                 'aliases = ["gpt-4o-mini"]\n[serve]\non_demand = true\n')
    return config


@pytest.fixture
async def fleet(running: Running, tmp_path: Path, bus_address: str,
                monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[tuple[Gateway, LyingPeer]]:
    monkeypatch.setattr(peers_mod, "POLL_EVERY", 0.2)
    with lying_peer(tmp_path, "alias", "peer-mini", "peer-model") as peer:
        async with gateway_on(bus_address, peers=(Peer("far", peer.url),)) as gateway:
            await until(lambda: listed(gateway, "peer-mini"), 20, "the peer read")
            yield gateway, peer


async def listed(gateway: Gateway, name: str) -> dict[str, Any] | None:
    async with httpx.AsyncClient(timeout=30) as c:
        r = await c.get(gateway.url + "/v1/models")  # type: ignore[attr-defined]
    assert r.status_code == 200, r.text
    return {m["id"]: m for m in r.json()["data"]}.get(name)


async def test_a_peers_alias_is_listed_with_what_it_is_an_alias_of(
        fleet: tuple[Gateway, LyingPeer]) -> None:
    gateway, _ = fleet
    entry = await listed(gateway, "peer-mini")
    assert entry is not None
    facts = entry["lokid"]
    assert facts["alias_of"] == "peer-model" and facts["host"] == "far"
    # what a client picks by is kept, typed; a word lokid does not know is dropped
    assert facts["capabilities"] == ["chat", "completion"]
    assert facts["context_length"] == 8192
    assert await listed(gateway, "peer-model") is not None
    assert (await listed(gateway, "gpt-4o-mini") or {})["lokid"]["alias_of"] == "qwen"


async def test_a_local_alias_wins_over_a_peers_model_of_that_name(
        fleet: tuple[Gateway, LyingPeer], running: Running) -> None:
    gateway, peer = fleet
    peer.say("good", "gpt-4o-mini")
    await until(lambda: _conflict(gateway), 20, "the clash named")
    entry = await listed(gateway, "gpt-4o-mini")
    assert entry is not None
    assert entry["lokid"]["alias_of"] == "qwen" and "host" not in entry["lokid"]
    assert entry["lokid"]["conflict"] == ("far lists a model named 'gpt-4o-mini': this "
                                          "host's alias of preset 'qwen' is the one routed to")
    async with httpx.AsyncClient(base_url=gateway.url, timeout=120) as c:  # type: ignore[attr-defined]
        r = await c.post("/v1/chat/completions", json={
            "model": "gpt-4o-mini", "messages": [{"role": "user", "content": "Hi"}],
            "max_tokens": 4})
    assert r.status_code == 200, r.text
    assert [e[0] for e in running.events if e[1] == "loading"] == ["qwen"]
    assert peer.posts() == []   # nothing was sent to the peer


async def _conflict(gateway: Gateway) -> bool:
    entry = await listed(gateway, "gpt-4o-mini")
    return entry is not None and "conflict" in entry["lokid"]
