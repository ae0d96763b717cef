"""Named keys through the real gateway, daemon and engine (issue 46, item 1): a key's
models on every route a model is named by (the body, ``?model=`` of GET /props,
``default_model``, ``/v1/models`` and ``/v1/models/<id>``, the known names a refusal
lists, a peer's models), a model it may not use answered as one that does not exist;
a revocation in force within a second while that key's stream in flight finishes;
an expired key refused."""

from __future__ import annotations

import json
import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from support.enginekit import free_port, write_config, write_preset
from support.gatewaykit import app_on_loopback, gateway_on, until

from lokid.core.fleet.peers import Peer
from lokid.core.serve.keys import digest
from lokid.gateway import peers as peers_mod

pytestmark = [pytest.mark.engine, pytest.mark.slow]

ALICE, PEERER, ALL, OLD = "sk-loki-alice-1", "sk-loki-peerer-2", "sk-loki-all-3", "sk-loki-old-4"
Seen = list[tuple[str, dict[str, str]]]


def entry(name: str, secret: str, extra: str = "") -> str:
    return f'[keys.{name}]\nhash = "{digest(secret)}"\n{extra}\n'


def write_keys(path: Path, revoked: bool = False) -> None:
    """alice: alpha only; peerer: the peer's models; all: every model; old: expired.
    Written as lokid.store.keystore writes it (a new file renamed over the old)."""
    text = (entry("alice", ALICE, 'models = ["alpha"]'
                  + ("\nrevoked = 2026-01-01T00:00:00Z" if revoked else ""))
            + entry("peerer", PEERER, 'models = ["peer-*"]') + entry("all", ALL)
            + entry("old", OLD, "expires = 2026-01-01T00:00:00Z"))
    part = path.with_suffix(".part")
    part.write_text(text)
    os.replace(part, path)


@pytest.fixture
async def recorders() -> AsyncIterator[tuple[str, str, Seen, Seen]]:
    """An external API and a peer gateway (listing "peer-only"), real aiohttp servers
    keeping the path and headers of each request: (api url, peer url, api's, peer's)."""
    from aiohttp import web

    def app(seen: Seen) -> web.Application:
        async def chat(request: web.Request) -> web.Response:
            body = await request.json()
            seen.append((request.path, dict(request.headers)))
            return web.json_response({"id": "r1", "object": "chat.completion", "created": 0,
                                      "model": body["model"], "choices": [{
                                          "index": 0, "finish_reason": "stop", "message": {
                                              "role": "assistant", "content": "recorded"}}]})

        async def models(request: web.Request) -> web.Response:
            return web.json_response({"object": "list", "data": [{
                "id": "peer-only", "object": "model", "owned_by": "peer",
                "lokid": {"state": "ready", "on_demand": False, "status": "",
                          "in_flight": 0, "fits": True}}]})

        a = web.Application()
        a.router.add_post("/v1/chat/completions", chat)
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
    write_preset(config, "alpha", f'model = "llama.gguf"\nctx = 1024\nport = {free_port()}\n'
                 "[serve]\non_demand = true\n")
    write_preset(config, "beta", f'model = "llama.gguf"\nctx = 1024\nport = {free_port()}\n')
    write_preset(config, "recorded", f'kind = "external"\nurl = "{recorders[0]}"\n')
    return config


def chat(model: str | None, **more: Any) -> dict[str, Any]:
    body = {"messages": [{"role": "user", "content": "Hello"}], "max_tokens": 4,
            "temperature": 0, **more}
    return body if model is None else {"model": model, **body}


def not_found(r: httpx.Response, name: str) -> str:
    """The refusal of a model that does not exist, for ``name``: its message."""
    assert r.status_code == 404, r.text
    error = r.json()["error"]
    assert error["code"] == "model_not_found" and f"no model {name!r}" in error["message"]
    return str(error["message"])


async def test_a_keys_models_hold_on_every_route(
        running: Any, bus_address: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        recorders: tuple[str, str, Seen, Seen]) -> None:
    monkeypatch.setattr(peers_mod, "POLL_EVERY", 0.2)   # the test waits less; same rule
    _, peer_url, api_seen, peer_seen = recorders
    keys = tmp_path / "keys.toml"
    write_keys(keys)
    async with gateway_on(bus_address, keys_file=str(keys), default_model="beta",
                          peers=(Peer("rec", peer_url),)) as gw:
        url = gw.url  # type: ignore[attr-defined]

        def as_key(key: str) -> httpx.AsyncClient:
            return httpx.AsyncClient(base_url=url, timeout=120, headers={"x-api-key": key})

        async with as_key(ALL) as c:
            await until(lambda: _lists(c, "peer-only"), 20, "the peer's model listed")
            ids = [m["id"] for m in (await c.get("/v1/models")).json()["data"]]
            assert ids == ["alpha", "beta", "peer-only", "recorded"]
            # beta exists: not on demand, its refusal is the one a model that exists gets
            r = await c.post("/v1/chat/completions", json=chat("beta"))
            assert r.status_code == 503 and "lokictl start beta" in r.text
        async with as_key(ALICE) as c:
            r = await c.get("/v1/models")
            assert [m["id"] for m in r.json()["data"]] == ["alpha"]
            assert (await c.get("/v1/models/alpha")).status_code == 200
            for name in ("beta", "recorded", "peer-only"):
                message = not_found(await c.get(f"/v1/models/{name}"), name)
                assert message.endswith("the known ones are alpha"), message
                message = not_found(await c.post("/v1/chat/completions", json=chat(name)),
                                    name)
                assert message.endswith("the known ones are alpha"), message
            not_found(await c.get("/props", params={"model": "beta"}), "beta")
            not_found(await c.post("/v1/chat/completions", json=chat(None)), "beta")  # default
            # and as for a name nobody serves: nothing tells the two apart
            assert not_found(await c.get("/v1/models/nowhere"), "nowhere").endswith("alpha")
            assert not api_seen and not [p for p, _ in peer_seen]   # nothing was sent on
            r = await c.post("/v1/chat/completions", json=chat("alpha"))
            assert r.status_code == 200, r.text
            r = await c.get("/props", params={"model": "alpha"})
            assert r.status_code == 200, r.text
        async with as_key(PEERER) as c:
            r = await c.get("/v1/models")
            assert [m["id"] for m in r.json()["data"]] == ["peer-only"]
            r = await c.post("/v1/chat/completions", json=chat("peer-only"))
            assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"] \
                == "recorded", r.text
            r = await c.post("/v1/chat/completions", json=chat(None))
            assert not_found(r, "beta").endswith("the known ones are peer-only")
            not_found(await c.post("/v1/chat/completions", json=chat("alpha")), "alpha")
        assert [p for p, _ in peer_seen] == ["/v1/chat/completions"]
        async with as_key(OLD) as c:
            r = await c.get("/v1/models")
            assert r.status_code == 401 and "key 'old' has expired" in r.text


async def test_a_revoked_keys_next_request_is_refused_while_its_stream_finishes(
        running: Any, bus_address: str, tmp_path: Path) -> None:
    keys = tmp_path / "keys.toml"
    write_keys(keys)
    async with gateway_on(bus_address, keys_file=str(keys)) as gw, \
            httpx.AsyncClient(base_url=gw.url, timeout=120,  # type: ignore[attr-defined]
                              headers={"Authorization": f"Bearer {ALICE}"}) as c:
        body = chat("alpha", stream=True, max_tokens=48)
        events: list[str] = []
        async with c.stream("POST", "/v1/chat/completions", json=body) as r:
            assert r.status_code == 200
            # httpx before 0.24 (Debian 12's 0.23.3) keeps each line's ending
            lines = (line.rstrip("\r\n") async for line in r.aiter_lines())
            async for line in lines:
                if line.startswith("data: "):
                    events.append(line[len("data: "):])
                    break
            write_keys(keys, revoked=True)   # lokictl keys revoke alice, mid-stream

            async def refused() -> bool:
                r = await c.get("/v1/models")
                return r.status_code == 401 and "key 'alice' was revoked" in r.text
            await until(refused, 2 * 1.0, "the revoked key refused within twice a second")
            async for line in lines:   # the stream let in before goes on to its end
                if line.startswith("data: "):
                    events.append(line[len("data: "):])
        assert events[-1] == "[DONE]", events[-3:]
        chunks = [json.loads(e) for e in events[:-1]]
        assert not any("error" in e for e in chunks), chunks
        assert any(e["choices"] and e["choices"][0].get("finish_reason") for e in chunks)
        r = await c.post("/v1/chat/completions", json=chat("alpha"),
                         headers={"Authorization": f"Bearer {ALL}"})
        assert r.status_code == 200   # the others' keys stand


async def _lists(c: httpx.AsyncClient, name: str) -> bool:
    r = await c.get("/v1/models")
    return r.status_code == 200 and name in {m["id"] for m in r.json()["data"]}


async def test_rotation_a_broken_file_and_the_flat_file_through_the_gateway(
        running: Any, bus_address: str, tmp_path: Path) -> None:
    """No engine needed: /v1/models answers for a key the gateway takes."""
    keys = tmp_path / "keys.toml"

    def rotated(until: str) -> None:
        part = keys.with_suffix(".part")
        old = digest("sk-loki-ci-old")
        part.write_text(entry("ci", "sk-loki-ci-new", f'previous_hash = "{old}"\n'
                              f"previous_until = {until}"))
        os.replace(part, keys)

    rotated("2099-01-01T00:00:00Z")   # the old key's grace: until 2099
    async with gateway_on(bus_address, keys_file=str(keys), keys=frozenset({"flat-key"})) as gw, \
            httpx.AsyncClient(base_url=gw.url, timeout=30) as c:  # type: ignore[attr-defined]

        async def status(key: str) -> int:
            return (await c.get("/v1/models", headers={"x-api-key": key})).status_code

        assert [await status(k) for k in ("sk-loki-ci-new", "sk-loki-ci-old", "flat-key")] \
            == [200, 200, 200]
        rotated("2026-01-01T00:00:00Z")   # the grace is over

        async def old_refused() -> bool:
            r = await c.get("/v1/models", headers={"x-api-key": "sk-loki-ci-old"})
            return r.status_code == 401 and "key 'ci' was rotated" in r.text
        await until(old_refused, 2 * 1.0, "the old key refused within twice a second")
        assert await status("sk-loki-ci-new") == 200
        # a file broken by hand: the last good set stays (ci's new key, the flat file's)
        keys.write_text(keys.read_text() + "[keys.half\n")
        await until(lambda: _said(gw), 2 * 1.0, "the broken file said")
        assert [await status(k) for k in ("sk-loki-ci-new", "flat-key", "sk-loki-ci-old")] \
            == [200, 200, 401]


async def _said(gw: Any) -> bool:
    return "TOML syntax error" in gw.keyring.problem
