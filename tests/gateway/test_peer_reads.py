"""Reading a peer gateway's models (lokid.gateway.peers) from peers that misbehave: real
HTTP servers (aiohttp) answering what a broken or hostile host could. Each leaves the
peer down with a reason that names no address, bounded in time and memory; a good
answer brings it back up."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiohttp import web
from support.enginekit import free_port
from support.gatewaykit import app_on_loopback

from lokid.core.fleet.listing import MAX_MODELS
from lokid.core.fleet.peers import Peer
from lokid.gateway import peers as peers_mod
from lokid.gateway.peers import HOP_HEADER, Peers
from lokid.gateway.relay import session

GOOD = {"object": "list", "data": [
    {"id": "qwen", "object": "model", "lokid": {"state": "ready", "on_demand": True,
                                                "status": "", "in_flight": 3, "fits": True}},
    {"id": "api", "object": "model", "lokid": {"state": "external", "on_demand": False}},
    {"id": "plain", "object": "model"}]}


@contextlib.asynccontextmanager
async def serving(models: Any) -> AsyncIterator[str]:
    """A real aiohttp server on loopback whose GET /v1/models is ``models``: its URL."""
    app = web.Application()
    app.router.add_get("/v1/models", models)
    async with app_on_loopback(app) as url:
        yield url


@pytest.fixture
async def peer() -> AsyncIterator[tuple[str, dict[str, Any]]]:
    """A server whose /v1/models answers what ``mode["answer"]`` says, keeping the
    headers it was sent."""
    mode: dict[str, Any] = {"answer": "good", "seen": [], "release": asyncio.Event()}

    async def models(request: web.Request) -> web.StreamResponse:
        mode["seen"].append(dict(request.headers))
        answer = mode["answer"]
        if answer == "good":
            return web.json_response(GOOD)
        if answer == "500":
            return web.Response(status=500, text="oops")
        if answer == "junk":
            return web.Response(text="<html>not json</html>")
        if answer == "huge":   # an endless body: read no more than the bound
            response = web.StreamResponse()
            await response.prepare(request)
            chunk = b" " * 65536
            for _ in range(200):
                await response.write(chunk)
            return response
        await mode["release"].wait()   # silent until the test ends
        return web.json_response(GOOD)

    async with serving(models) as url:
        try:
            yield url, mode
        finally:
            mode["release"].set()   # the silent answer ends: the server can stop


@pytest.mark.parametrize("answer,why", [
    ("500", "its /v1/models answered 500"),
    ("junk", "its /v1/models answer is not JSON"),
    ("huge", f"its /v1/models is over {peers_mod.MAX_LISTING} bytes"),
    ("silent", "its /v1/models did not answer in 0.5 s"),
])
async def test_a_peer_that_misbehaves_is_down_with_why_then_up_again(
        peer: tuple[str, dict[str, Any]], answer: str, why: str,
        monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> None:
    monkeypatch.setattr(peers_mod, "READ_TIMEOUT", 0.5)
    url, mode = peer
    key = tmp_path / "k"
    key.write_text("sk-peer\n")
    client = session()
    peers = Peers([Peer("gpu2", url, str(key))], lambda: client)
    state = peers.states["gpu2"]
    try:
        await peers.read(state)
        assert state.up and peers.summary() == {"gpu2": ""}
        assert set(state.models) == {"qwen", "api", "plain"}
        assert state.models["qwen"].in_flight == 3 and state.models["qwen"].fits is True
        assert state.models["api"].state == "ready" and state.models["api"].kind == "external"
        assert state.models["plain"].state == "ready"   # an OpenAI API, not a lokid
        # the peer key and the hop mark were sent
        assert mode["seen"][-1]["Authorization"] == "Bearer sk-peer"
        assert mode["seen"][-1][HOP_HEADER] == "1"
        mode["answer"] = answer
        await peers.read(state)
        assert not state.up and peers.summary()["gpu2"] == why
        assert "127.0.0.1" not in why
        # what it served is listed unavailable, and a request for it is known to be there
        assert peers.listing()["qwen"]["gpu2"]["state"] == "unavailable"
        assert peers.knows("qwen") and not peers.knows("other")
        assert [h.name for h in peers.hosts(None, "qwen") if not h.up] == ["gpu2"]
        mode["answer"] = "good"
        await peers.read(state)
        assert state.up and state.failures == 0
    finally:
        await client.close()


async def test_a_peer_that_refuses_the_connection_is_down_without_its_address(
        tmp_path: Any) -> None:
    client = session()
    peers = Peers([Peer("gpu2", f"http://127.0.0.1:{free_port()}")], lambda: client)
    try:
        await peers.read(peers.states["gpu2"])
    finally:
        await client.close()
    assert peers.summary() == {"gpu2": "cannot connect (Connection refused)"}


async def test_a_name_of_another_kind_on_a_peer_is_no_replica_and_the_conflict_is_shown(
        peer: tuple[str, dict[str, Any]]) -> None:
    """The peer serves "api" as an external API and "qwen" as an engine; here "api" is an
    engine and "qwen" an external preset: the local presets win, each conflict said."""
    from lokid.core.fleet.route import LOCAL, Model
    from lokid.gateway.catalog import with_peers

    url, _ = peer
    client = session()
    peers = Peers([Peer("gpu2", url)], lambda: client)
    try:
        await peers.read(peers.states["gpu2"])
    finally:
        await client.close()
    assert peers.route("api", Model("inactive", on_demand=False)).candidates == ()
    assert peers.route("api", None).candidates == ("gpu2",)   # not here: the peer's
    assert peers.route("qwen", Model("ready", kind="external")).candidates == (LOCAL,)
    entries = {"api": {"id": "api", "lokid": {"state": "inactive"}},
               "qwen": {"id": "qwen", "lokid": {"state": "external"}}}
    with_peers(entries, {}, peers.listing())
    assert entries["api"]["lokid"]["replicas"] == {}
    assert entries["api"]["lokid"]["conflict"] == (
        "gpu2 serves another kind of model named 'api' (an external API): this host's "
        "preset is the one routed to")
    assert "an engine" in entries["qwen"]["lokid"]["conflict"]
    assert "plain" in entries and entries["plain"]["lokid"]["host"] == "gpu2"


async def test_a_peer_listing_as_many_models_as_allowed_is_read_whole(
        tmp_path: Any) -> None:
    """As many models as allowed: at the bound, every one listed and routed."""
    many = {"object": "list", "data": [
        {"id": f"m{i:05d}", "object": "model", "lokid": {"state": "inactive", "on_demand":
                                                         True, "in_flight": 0, "fits": True}}
        for i in range(MAX_MODELS)]}

    async def models(_: web.Request) -> web.Response:
        return web.json_response(many)

    client = session()
    async with serving(models) as url:
        peers = Peers([Peer("big", url)], lambda: client)
        try:
            await peers.read(peers.states["big"])
        finally:
            await client.close()
    assert len(peers.states["big"].models) == MAX_MODELS
    assert peers.route(f"m{MAX_MODELS - 1:05d}", None).candidates == ("big",)


def test_a_peer_key_over_plain_http_beyond_loopback_is_warned_about_at_load(
        tmp_path: Any, caplog: pytest.LogCaptureFixture) -> None:
    """Issue 45, item 3: the README's example sent peer keys over plain http://."""
    key = str(tmp_path / "k")
    Peers([Peer("gpu2", "http://10.0.0.3:8000", key), Peer("tls", "https://10.0.0.4:8443", key),
           Peer("here", "http://127.0.0.1:8001", key), Peer("v6", "http://[::1]:8002", key),
           Peer("open", "http://10.0.0.5:8000")], lambda: None)
    warned = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert warned == ["peer gateway gpu2: its key is sent over plain http:// to 10.0.0.3, "
                      "readable on the way with every prompt: use https:// (a TLS proxy in "
                      "front of that gateway), or a network only these hosts reach"]


async def test_an_https_peer_is_read_with_its_certificate_verified(tmp_path: Any) -> None:
    """A peer behind TLS (the lying peer's server in its own process, a certificate for
    127.0.0.1 signed by itself): refused by the gateway's own session, which verifies
    against the system's CAs, saying why without an address; read once that certificate
    is trusted."""
    import ssl

    import aiohttp
    from support.lyingpeer import lying_peer, self_signed

    cert, key = self_signed(tmp_path)
    with lying_peer(tmp_path, "good", "secure", tls=(cert, key)) as liar:
        assert liar.url.startswith("https://")
        client = session()
        peers = Peers([Peer("tls", liar.url)], lambda: client)
        try:
            await peers.read(peers.states["tls"])
        finally:
            await client.close()
        assert peers.summary() == {"tls": "its TLS certificate was refused: self-signed "
                                          "certificate"}
        trusting = aiohttp.ClientSession(connector=aiohttp.TCPConnector(
            ssl=ssl.create_default_context(cafile=str(cert))))
        peers = Peers([Peer("tls", liar.url)], lambda: trusting)
        try:
            await peers.read(peers.states["tls"])
        finally:
            await trusting.close()
    assert peers.summary() == {"tls": ""} and set(peers.states["tls"].models) == {"secure"}


async def test_a_peer_flapping_between_answers_writes_a_few_lines_a_minute(
        peer: tuple[str, dict[str, Any]], caplog: pytest.LogCaptureFixture) -> None:
    """Each change of a peer's state is worth a line, but a peer changing at every read
    (a lie, an error, a good listing, again) must not fill the journal."""
    import logging

    caplog.set_level(logging.INFO, "lokid.gateway")
    url, mode = peer
    client = session()
    peers = Peers([Peer("gpu2", url)], lambda: client)
    try:
        for _ in range(5):
            for answer in ("500", "junk", "good"):
                mode["answer"] = answer
                await peers.read(peers.states["gpu2"])
    finally:
        await client.close()
    lines = [r.getMessage() for r in caplog.records if "peer gateway gpu2" in r.getMessage()]
    assert 1 <= len(lines) <= 3, lines   # LINES_PER_MINUTE
    assert peers.summary() == {"gpu2": ""}   # the state is right, logged or not
