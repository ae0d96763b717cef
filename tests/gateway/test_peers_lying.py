"""A peer gateway that lies (issue 45, items 2 and 3), against the real gateway: the peer
is a real HTTP server in its own process (tests/support/lyingpeer.py) answering what a
broken or hostile host could; the gateway is lokid's, on a private bus, reading it.

Whatever the peer says, the gateway refuses what is over its bounds with one line
naming the peer and why, keeps reading it, shows a client nothing of the peer's but
model ids that pass the name rules, and answers this host's own model here."""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from support.daemonkit import daemon_on
from support.enginekit import free_port, write_config, write_preset
from support.gatewaykit import gateway_on, until
from support.lyingpeer import HUGE, LyingPeer, answer, lying_peer

from lokid.core.fleet import listing as listing_mod
from lokid.core.fleet.peers import Peer
from lokid.gateway import peers as peers_mod
from lokid.gateway.server import Gateway


@pytest.fixture
async def liar(tmp_path: Path, bus_address: str, monkeypatch: pytest.MonkeyPatch
               ) -> AsyncIterator[tuple[Gateway, LyingPeer]]:
    """The gateway (no daemon: its peer's models only) and the lying peer it reads,
    which says "peer-only" until told otherwise. Reads come faster; the same rule."""
    monkeypatch.setattr(peers_mod, "POLL_EVERY", 0.2)
    monkeypatch.setattr(peers_mod, "BACKOFF", (0.2,))
    with lying_peer(tmp_path, "good", "peer-only") as peer:
        async with gateway_on(bus_address, peers=(Peer("liar", peer.url),)) as gateway:
            await until(lambda: shows(gateway, "peer-only", "ready"), 20, "the peer read")
            yield gateway, peer


async def listed(gateway: Gateway) -> tuple[str, dict[str, Any]]:
    """GET /v1/models: its text, and its models by id."""
    async with httpx.AsyncClient(timeout=30) as c:
        r = await c.get(gateway.url + "/v1/models")  # type: ignore[attr-defined]
    assert r.status_code == 200, r.text
    return r.text, {m["id"]: m for m in r.json()["data"]}


async def shows(gateway: Gateway, name: str, state: str) -> bool:
    _, found = await listed(gateway)
    return name in found and found[name]["lokid"]["state"] == state


def down_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records
            if r.getMessage().startswith("peer gateway liar is down")]


async def test_a_deep_listing_is_refused_in_one_line_and_the_peer_read_again(
        liar: tuple[Gateway, LyingPeer], caplog: pytest.LogCaptureFixture) -> None:
    """100,000 lists deep: its reads ended for good, silently, its last listing "up"."""
    gateway, peer = liar
    peer.say("deep")
    why = "its /v1/models nests deeper than JSON is read here"
    await until(lambda: shows(gateway, "peer-only", "unavailable"), 20, "the peer refused")
    assert gateway.peers.summary() == {"liar": why}
    failures = gateway.peers.states["liar"].failures
    await until(lambda: _after(gateway, failures + 5), 20, "the peer read five times more")
    assert down_lines(caplog) == [f"peer gateway liar is down: {why}"]   # one line
    peer.say("good", "back")
    await until(lambda: shows(gateway, "back", "ready"), 20, "the peer read again")
    assert gateway.peers.summary() == {"liar": ""}


async def _after(gateway: Gateway, failures: int) -> bool:
    return gateway.peers.states["liar"].failures >= failures


@pytest.mark.parametrize("mode,why", [
    ("huge", f"its /v1/models is {HUGE} bytes: at most {listing_mod.MAX_BYTES}"),
    ("endless", f"its /v1/models is over {listing_mod.MAX_BYTES} bytes"),
    ("many", f"its /v1/models is {len(answer(['many']) or b'')} bytes: at most "
             f"{listing_mod.MAX_BYTES}"),
    (f"big {listing_mod.MAX_MODELS + 1}", f"its /v1/models lists "
     f"{listing_mod.MAX_MODELS + 1} models: at most {listing_mod.MAX_MODELS}"),
    ("malformed", "its /v1/models answer is not JSON"),
    ("nothttp", "its answer is not valid HTTP"),
])
async def test_a_listing_over_the_bounds_or_malformed_reaches_no_client(
        liar: tuple[Gateway, LyingPeer], caplog: pytest.LogCaptureFixture, mode: str,
        why: str) -> None:
    gateway, peer = liar
    peer.say(*mode.split())
    await until(lambda: shows(gateway, "peer-only", "unavailable"), 20, "the peer refused")
    assert gateway.peers.summary() == {"liar": why}
    text, found = await listed(gateway)
    assert set(found) == {"peer-only"}, sorted(found)[:5]
    port = peer.url.rsplit(":", 1)[1]
    for shown in ("10.9.8.7", "127.0.0.1", port, "SSH", "html"):
        assert shown not in text, (shown, text)
    assert found["peer-only"]["lokid"]["status"] == f"peer gateway liar is down: {why}"
    assert down_lines(caplog) == [f"peer gateway liar is down: {why}"]


async def test_ids_that_are_no_model_names_and_text_beyond_the_facts_are_left_out(
        liar: tuple[Gateway, LyingPeer], caplog: pytest.LogCaptureFixture) -> None:
    gateway, peer = liar
    peer.say("badids")
    await until(lambda: shows(gateway, "fine", "ready"), 20, "the new listing read")
    text, found = await listed(gateway)
    assert set(found) == {"fine"}, sorted(found)
    assert "10.9.8.7" not in text and "script" not in text and "a" * 129 not in text
    assert found["fine"]["lokid"]["status"] == "see <address>"
    assert set(found["fine"]["lokid"]) <= {"state", "on_demand", "status", "in_flight",
                                           "fits", "host", "replicas"}
    assert any("5 entries of its /v1/models left out" in r.getMessage()
               for r in caplog.records), caplog.text


async def test_a_big_allowed_listing_is_parsed_once_and_merged_once(
        liar: tuple[Gateway, LyingPeer], monkeypatch: pytest.MonkeyPatch) -> None:
    """As many models as allowed, read every 0.2 s: parsed when they change, not at each
    read, and merged for /v1/models when a read changed them, not for each request."""
    gateway, peer = liar
    parsed: list[int] = []
    real = listing_mod.read_listing

    def counting(data: bytes) -> Any:
        parsed.append(len(data))
        return real(data)

    monkeypatch.setattr(peers_mod, "read_listing", counting)
    peer.say("big", str(listing_mod.MAX_MODELS))
    last = f"m{listing_mod.MAX_MODELS - 1:05d}"
    await until(lambda: shows(gateway, last, "ready"), 20, "the big listing read")
    failures = gateway.peers.states["liar"].failures
    merged = gateway.peers.listing()
    for _ in range(3):
        _, found = await listed(gateway)
        assert len(found) == listing_mod.MAX_MODELS
    gets = peer.gets()
    await until(lambda: _reads(peer, gets + 10), 20, "ten more reads")
    assert len(parsed) == 1 and gateway.peers.states["liar"].failures == failures
    assert gateway.peers.listing() is merged


async def _reads(peer: LyingPeer, gets: int) -> bool:
    return peer.gets() >= gets


@pytest.fixture
def config(tmp_path: Path, engine: str, models: Any) -> Path:
    """This host serves ``alpha`` on demand (the real engine)."""
    assert Path(models.llama).name == "llama.gguf"   # generated on first use
    config = write_config(tmp_path, engine, [models.dir])
    write_preset(config, "alpha", f'model = "llama.gguf"\nctx = 1024\nport = {free_port()}\n'
                 "[serve]\non_demand = true\n")
    return config


@pytest.mark.engine
async def test_a_peer_claiming_this_hosts_model_ready_does_not_take_its_requests(
        tmp_path: Path, config: Path, bus_address: str) -> None:
    """The peer lists ``alpha`` ready with nothing in flight; ``alpha`` is this host's,
    on demand and stopped: it is started here and answers, the peer gets nothing."""
    with lying_peer(tmp_path, "claim", "alpha") as peer:
        async with daemon_on(config, tmp_path, bus_address), \
                gateway_on(bus_address, peers=(Peer("liar", peer.url),)) as gateway:
            await until(lambda: _up(gateway), 20, "the peer read")
            async with httpx.AsyncClient(timeout=120) as c:
                for _ in range(3):
                    r = await c.post(gateway.url + "/v1/chat/completions",  # type: ignore
                                     json={"model": "alpha", "max_tokens": 2, "messages": [
                                         {"role": "user", "content": "Hi"}]})
                    assert r.status_code == 200, r.text
            assert peer.posts() == []
            text, found = await listed(gateway)
            assert found["alpha"]["lokid"]["state"] == "ready"   # this host's entry
            assert set(found["alpha"]["lokid"]["replicas"]) == {"liar"}
            assert re.search(r"127\.0\.0\.1|10\.9\.8\.7", json.dumps(found)) is None


async def _up(gateway: Gateway) -> bool:
    return gateway.peers.summary() == {"liar": ""}
