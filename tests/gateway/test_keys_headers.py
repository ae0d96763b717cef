"""The two defects of issue 46's keys, through the real gateway, daemon and engine:

- a key sent the Anthropic way (``x-api-key: KEY``) or as a bare ``Authorization: KEY``
  was refused 401 by a gateway with ``api_keys_file``, where llama-server and llama.cpp's
  router answer it;
- a client's ``x-api-key`` reached an external preset's API and a peer gateway (only
  ``Authorization`` was dropped): here the "API" and the "peer" are real HTTP servers
  that keep every header they were sent.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from support.enginekit import free_port, write_config, write_preset
from support.gatewaykit import app_on_loopback, gateway_on, until

from lokid.core.fleet.peers import Peer
from lokid.core.serve.keys import CLIENT_KEY_HEADERS
from lokid.gateway import peers as peers_mod
from lokid.gateway.peers import HOP_HEADER
from lokid.gateway.relay import forwarded

pytestmark = [pytest.mark.engine, pytest.mark.slow]

CLIENT_KEY = "sk-team-4e1f0a"        # the gateway's own client key
UPSTREAM_KEY = "sk-upstream-93bd"    # the external preset's key (its api_key_file)
PEER_KEY = "sk-peer-0c77"            # the key this gateway presents to its peer
Seen = list[tuple[str, dict[str, str]]]


def chat(model: str, **more: Any) -> dict[str, Any]:
    return {"model": model, "messages": [{"role": "user", "content": "Hello"}],
            "max_tokens": 4, "temperature": 0, **more}


@pytest.fixture
async def recorders() -> AsyncIterator[tuple[str, str, Seen, Seen]]:
    """An OpenAI API and a lokid peer gateway (its /v1/models lists "peer-only"), each a
    real aiohttp server keeping (path, headers) of every request: (api url, peer url,
    what the API saw, what the peer saw)."""
    from aiohttp import web

    def app(seen: Seen) -> web.Application:
        async def chat_answer(request: web.Request) -> web.Response:
            body = await request.json()
            seen.append((request.path, dict(request.headers)))
            return web.json_response({"id": "r1", "object": "chat.completion", "created": 0,
                                      "model": body["model"], "choices": [{
                                          "index": 0, "finish_reason": "stop", "message": {
                                              "role": "assistant", "content": "recorded"}}]})

        async def models(request: web.Request) -> web.Response:
            seen.append((request.path, dict(request.headers)))
            return web.json_response({"object": "list", "data": [{
                "id": "peer-only", "object": "model", "owned_by": "peer",
                "lokid": {"state": "ready", "on_demand": False, "status": "",
                          "in_flight": 0, "fits": True}}]})

        a = web.Application()
        a.router.add_post("/v1/chat/completions", chat_answer)
        a.router.add_get("/v1/models", models)
        return a

    api_seen: Seen = []
    peer_seen: Seen = []
    async with app_on_loopback(app(api_seen)) as api, app_on_loopback(app(peer_seen)) as peer:
        yield f"{api}/v1", peer, api_seen, peer_seen


@pytest.fixture
def config(tmp_path: Path, engine: str, models: Any,
           recorders: tuple[str, str, Seen, Seen]) -> Path:
    assert Path(models.llama).name == "llama.gguf"
    config = write_config(tmp_path, engine, [models.dir])
    (tmp_path / "upstream.key").write_text(UPSTREAM_KEY + "\n")
    write_preset(config, "alpha", f'model = "llama.gguf"\nctx = 1024\nport = {free_port()}\n'
                 "[serve]\non_demand = true\n")
    write_preset(config, "recorded", f'kind = "external"\nurl = "{recorders[0]}"\n'
                 f'api_key_file = "{tmp_path / "upstream.key"}"\n')
    return config


async def test_a_key_sent_as_x_api_key_or_bare_authorization_is_taken(
        running: Any, bus_address: str) -> None:
    """Defect 1: today's main answered both 401."""
    async with gateway_on(bus_address, keys=frozenset({CLIENT_KEY})) as gw, \
            httpx.AsyncClient(base_url=gw.url, timeout=120) as c:  # type: ignore[attr-defined]
        r = await c.post("/v1/chat/completions", json=chat("alpha"),
                         headers={"x-api-key": CLIENT_KEY})
        assert r.status_code == 200, r.text
        assert r.json()["choices"][0]["message"]["content"] is not None
        r = await c.post("/v1/chat/completions", json=chat("alpha"),
                         headers={"Authorization": CLIENT_KEY})
        assert r.status_code == 200, r.text
        # what an Anthropic client sends, on the route it sends it to
        r = await c.post("/v1/messages", json={
            "model": "alpha", "max_tokens": 4, "messages": [{"role": "user",
                                                             "content": "Hello"}]},
            headers={"x-api-key": CLIENT_KEY, "anthropic-version": "2023-06-01"})
        assert r.status_code == 200, r.text
        assert r.json()["type"] == "message"
        for wrong in ({"x-api-key": "sk-wrong"}, {"Authorization": "sk-wrong"},
                      {"Authorization": f"Basic {CLIENT_KEY}"}, {}):
            r = await c.post("/v1/chat/completions", json=chat("alpha"), headers=wrong)
            assert r.status_code == 401, (wrong, r.text)
            assert r.json()["error"]["code"] == "invalid_api_key"
            assert "sk-wrong" not in r.text and CLIENT_KEY not in r.text


@pytest.mark.parametrize("keyed", [True, False], ids=["keyed", "keyless"])
async def test_no_client_key_header_reaches_an_external_api_or_a_peer(
        running: Any, bus_address: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        recorders: tuple[str, str, Seen, Seen], keyed: bool) -> None:
    """Defect 2: today's main sent the client's x-api-key (and api-key) on to both."""
    monkeypatch.setattr(peers_mod, "POLL_EVERY", 0.2)   # the test waits less; same rule
    _, peer_url, api_seen, peer_seen = recorders
    (tmp_path / "peer.key").write_text(PEER_KEY + "\n")
    settings: dict[str, Any] = {"peers": (Peer("rec", peer_url, str(tmp_path / "peer.key")),)}
    if keyed:
        settings["keys"] = frozenset({CLIENT_KEY})
    sent = {"Authorization": f"Bearer {CLIENT_KEY}", "x-api-key": CLIENT_KEY,
            "api-key": CLIENT_KEY, "Proxy-Authorization": f"Bearer {CLIENT_KEY}"}
    async with gateway_on(bus_address, **settings) as gw, \
            httpx.AsyncClient(base_url=gw.url, timeout=60, headers=sent) as c:  # type: ignore[attr-defined]
        await until(lambda: listed(c, "peer-only"), 20, "the peer's model listed")
        r = await c.post("/v1/chat/completions", json=chat("recorded"))
        assert r.status_code == 200, r.text
        r = await c.post("/v1/chat/completions", json=chat("peer-only"))
        assert r.status_code == 200, r.text
    # the API was also asked /v1/models by the daemon (its reachability)
    (api_headers,) = [h for p, h in api_seen if p == "/v1/chat/completions"]
    assert api_headers["Authorization"] == f"Bearer {UPSTREAM_KEY}"   # the preset's own key
    posts = [h for p, h in peer_seen if p == "/v1/chat/completions"]
    assert len(posts) == 1 and posts[0]["Authorization"] == f"Bearer {PEER_KEY}"
    assert posts[0][HOP_HEADER] == "1"
    for headers in (*(h for _, h in api_seen), *(h for _, h in peer_seen)):
        lowered = {k.lower() for k in headers}
        assert not lowered & {"x-api-key", "api-key", "proxy-authorization"}, headers
        assert CLIENT_KEY not in repr(headers)


async def listed(c: httpx.AsyncClient, name: str) -> bool:
    r = await c.get("/v1/models")
    return r.status_code == 200 and name in {m["id"] for m in r.json()["data"]}


def test_no_header_that_may_carry_a_key_is_forwarded_anywhere() -> None:
    """To this host's engines too (keyed gateway or not): only the preset's own key,
    added by the relay, ever leaves the gateway."""
    headers = {"Content-Type": "application/json", "X-Request-Id": "r-1",
               **{h.title(): "sk-client" for h in CLIENT_KEY_HEADERS},
               **{h.upper(): "sk-client" for h in CLIENT_KEY_HEADERS}}
    for local in (True, False):
        out = forwarded(headers, local)
        assert out == {"Content-Type": "application/json", "X-Request-Id": "r-1"}
