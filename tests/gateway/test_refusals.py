"""What the gateway refuses, in OpenAI's error shape, with the real daemon on a private bus
(no engine runs: every refusal comes before one would be reached)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest
from support.enginekit import free_port, write_config, write_preset
from support.gatewaykit import gateway_on

from lokid.gateway.server import Gateway


@pytest.fixture
def config(tmp_path: Path, engine: str, models: Any) -> Path:
    assert Path(models.llama).name == "llama.gguf"   # written now
    config = write_config(tmp_path, engine, [models.dir])
    write_preset(config, "alpha", f'model = "llama.gguf"\nctx = 2048\nport = {free_port()}\n')
    write_preset(config, "nomodel", 'model = "absent.gguf"\n')
    return config


def error_of(r: httpx.Response) -> dict[str, Any]:
    body = r.json()
    assert set(body) == {"error"} and {"message", "type", "code"} <= set(body["error"]), body
    return dict(body["error"])


async def test_bad_requests_get_openai_errors(gateway: Gateway) -> None:
    url = gateway.url  # type: ignore[attr-defined]
    async with httpx.AsyncClient(base_url=url) as c:
        r = await c.post("/v1/chat/completions", content=b'{"model": "alpha", "messages": [')
        assert r.status_code == 400 and error_of(r)["code"] == "invalid_json"
        r = await c.post("/v1/chat/completions", content=b'["alpha"]')
        assert r.status_code == 400 and "JSON object" in error_of(r)["message"]
        r = await c.post("/v1/chat/completions", json={"messages": []})
        assert r.status_code == 400 and error_of(r)["code"] == "model_required"
        assert "alpha" in error_of(r)["message"]
        r = await c.post("/v1/chat/completions", json={"model": "nope", "messages": []})
        e = error_of(r)
        assert r.status_code == 404 and e["code"] == "model_not_found"
        assert "'nope'" in e["message"] and "alpha" in e["message"]
        # a broken preset says why it is broken
        r = await c.post("/completion", json={"model": "nomodel", "prompt": "x"})
        assert r.status_code == 503 and "absent.gguf" in error_of(r)["message"]
        # a preset that is not on demand is never started by a request
        r = await c.post("/v1/chat/completions", json={"model": "alpha", "messages": []})
        e = error_of(r)
        assert r.status_code == 503 and "lokictl start alpha" in e["message"]
        assert (await c.get("/health")).json()["lokid"] == "reachable"


async def test_a_body_over_max_body_is_refused(running: Any, bus_address: str) -> None:
    async with gateway_on(bus_address, max_body=1000) as gw, \
            httpx.AsyncClient(base_url=gw.url) as c:  # type: ignore[attr-defined]
        big = b'{"model": "alpha", "prompt": "' + b"x" * 2000 + b'"}'
        r = await c.post("/completion", content=big)
        assert r.status_code == 413 and error_of(r)["code"] == "request_too_large"

        async def chunks() -> Any:   # no Content-Length: counted while read
            for _ in range(4):
                yield b"x" * 400

        r = await c.post("/completion", content=chunks())
        assert r.status_code == 413
        r = await c.post("/completion", content=b'{"model": "nope"}')
        assert r.status_code == 404   # under the bound: read and routed


async def test_default_model_stands_in_for_a_missing_one(running: Any, bus_address: str) -> None:
    async with gateway_on(bus_address, default_model="alpha") as gw, \
            httpx.AsyncClient(base_url=gw.url) as c:  # type: ignore[attr-defined]
        r = await c.post("/v1/chat/completions", json={"messages": []})
        assert r.status_code == 503 and "lokictl start alpha" in error_of(r)["message"]


async def test_client_keys(running: Any, bus_address: str) -> None:
    async with gateway_on(bus_address, keys=frozenset({"k-one", "k-two"})) as gw, \
            httpx.AsyncClient(base_url=gw.url) as c:  # type: ignore[attr-defined]
        r = await c.get("/v1/models")
        assert r.status_code == 401 and error_of(r)["code"] == "invalid_api_key"
        assert r.headers["WWW-Authenticate"] == "Bearer"
        r = await c.get("/v1/models", headers={"Authorization": "Bearer k-wrong"})
        assert r.status_code == 401 and "k-wrong" not in r.text
        r = await c.post("/completion", json={"model": "alpha"},
                         headers={"Authorization": "Basic k-one"})
        assert r.status_code == 401
        r = await c.get("/v1/models", headers={"Authorization": "Bearer k-two"})
        assert r.status_code == 200 and [m["id"] for m in r.json()["data"]] == ["alpha"]
        assert (await c.get("/health")).status_code == 200   # no key needed


async def test_models_lists_every_preset_with_its_state(gateway: Gateway) -> None:
    async with httpx.AsyncClient(base_url=gateway.url) as c:  # type: ignore[attr-defined]
        body = (await c.get("/v1/models")).json()
        assert body["object"] == "list"
        (alpha,) = body["data"]   # a broken preset is not offered to model pickers...
        nomodel = (await c.get("/v1/models/nomodel")).json()   # ...but shown by its name
        assert nomodel["lokid"]["state"] == "broken" and "absent.gguf" in nomodel["lokid"]["status"]
        assert alpha["id"] == "alpha" and alpha["object"] == "model"
        assert alpha["lokid"]["state"] == "inactive" and alpha["lokid"]["on_demand"] is False
        one = (await c.get("/v1/models/alpha")).json()
        assert one == alpha
        assert (await c.get("/v1/models/nope")).status_code == 404
