"""The routes and methods clients use beside inference (issue 48, item 1), through the
real daemon (local runner) on a private bus, the real gateway and the real llama-server
b11434, each answered as the engine answers it:

- ``HEAD /health``, ``HEAD /v1/models`` (a load balancer's or an uptime checker's
  probe) and ``GET /v1/health``: the ``GET``'s status and headers, no body (404 before);
  ``HEAD /props`` too (405 before);
- ``POST /v1/chat/completions/control`` reaches the engine running the completion, even
  while that completion holds its only slot, and starts no engine that is not running;
- ``POST /v1/audio/transcriptions``, a multipart form, routed by its ``model`` field to
  the preset's engine (which, with no audio model, says so: 501), and ``/v1/systemone``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest
from support.daemonkit import Running
from support.enginekit import free_port, write_config, write_preset
from support.sse import data_lines

from lokid.gateway.server import Gateway

pytestmark = [pytest.mark.engine, pytest.mark.slow]


@pytest.fixture
def config(tmp_path: Path, engine: str, models: Any) -> Path:
    assert Path(models.llama).name == "llama.gguf"
    config = write_config(tmp_path, engine, [models.dir])
    # one slot: a stream holds it while its control is asked
    write_preset(config, "alpha", f'model = "llama.gguf"\nctx = 2048\nport = {free_port()}\n'
                 'extra_args = ["-np", "1"]\n[serve]\non_demand = true\n')
    return config


async def head_as_get(c: httpx.AsyncClient, path: str) -> httpx.Response:
    """HEAD ``path``, checked against its GET: the same status and headers, no body."""
    get = await c.get(path)
    head = await c.head(path)
    assert head.status_code == get.status_code, (path, head.status_code, get.status_code)
    assert head.content == b"", path
    assert head.headers["Content-Type"] == get.headers["Content-Type"], path
    assert int(head.headers["Content-Length"]) == len(get.content), path
    return get


async def test_probes_answer_as_the_engine_does(running: Running, gateway: Gateway) -> None:
    async with httpx.AsyncClient(base_url=gateway.url, timeout=60) as c:  # type: ignore[attr-defined]
        for path in ("/health", "/v1/health"):
            r = await head_as_get(c, path)
            assert r.status_code == 200 and r.json()["status"] == "ok", path
        for path in ("/v1/models", "/models", "/v1/models/alpha"):
            r = await head_as_get(c, path)
            assert r.status_code == 200, (path, r.text)
        assert [m["id"] for m in (await c.get("/v1/models")).json()["data"]] == ["alpha"]
        r = await head_as_get(c, "/v1/models/nope")
        assert r.status_code == 404
        # a method the route does not take is still refused
        assert (await c.delete("/v1/health")).status_code == 404
        # a GET or HEAD of /props starts nothing
        r = await head_as_get(c, "/props?model=alpha")
        assert r.status_code == 503 and r.json()["error"]["code"] == "model_not_running"
        # a control asks a running completion: it starts no engine
        r = await c.post("/v1/chat/completions/control",
                         json={"model": "alpha", "id": "chatcmpl-x", "action": "reasoning_end"})
        assert r.status_code == 503 and r.json()["error"]["code"] == "model_not_running", r.text
        assert "a POST to /v1/chat/completions/control does not start" in r.text
    assert not [e for e in running.events if e[1] == "loading"], running.events


def transcription(model: str | None) -> dict[str, Any]:
    data = {"response_format": "json"} | ({"model": model} if model is not None else {})
    return {"data": data, "files": {"file": ("a.wav", b"RIFF" + bytes(4096), "audio/wav")}}


async def test_control_transcription_and_decision_routes_reach_the_engine(
        running: Running, gateway: Gateway) -> None:
    async with httpx.AsyncClient(base_url=gateway.url, timeout=120) as c:  # type: ignore[attr-defined]
        # a transcription's model is its form's field: the engine (started for it) says
        # its model hears nothing, as llama-server does
        r = await c.post("/v1/audio/transcriptions", **transcription("alpha"))
        assert r.status_code == 501, r.text
        assert "does not support audio input" in r.json()["error"]["message"], r.text
        assert [e[0] for e in running.events if e[1] == "loading"] == ["alpha"]
        r = await c.post("/audio/transcriptions", **transcription("alpha"))
        assert r.status_code == 501, r.text
        r = await head_as_get(c, "/props?model=alpha")   # its engine's, no model_path
        assert r.status_code == 200 and "model_path" not in r.json()
        assert r.json()["total_slots"] == 1
        r = await c.post("/v1/audio/transcriptions", **transcription("nope"))
        assert r.status_code == 404 and "alpha" in r.json()["error"]["message"], r.text
        r = await c.post("/v1/audio/transcriptions", **transcription(None))
        assert r.status_code == 400 and "which model" in r.json()["error"]["message"], r.text
        r = await c.post("/v1/audio/transcriptions", content=b"--x\r\n",
                         headers={"Content-Type": "multipart/form-data; boundary=x"})
        assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_form", r.text
        r = await c.post("/v1/systemone", json={"model": "alpha"})
        assert r.status_code == 501 and "not a decision model" in r.text, r.text

        # a control for the completion streaming in the engine's only slot: answered by
        # that engine now (it knows the completion), not after the stream
        chat = {"model": "alpha", "messages": [{"role": "user", "content": "Hello"}],
                "max_tokens": 400, "ignore_eos": True, "stream": True}
        async with c.stream("POST", "/v1/chat/completions", json=chat) as stream:
            events = data_lines(stream)
            async for data in events:
                completion = json.loads(data)["id"]
                break
            r = await c.post("/v1/chat/completions/control", json={
                "model": "alpha", "id": completion, "action": "reasoning_end"})
            assert r.status_code == 200, r.text
            assert r.json()["message"] == "reasoning control not enabled for this completion"
            rest = [data async for data in events]
            assert rest[-1] == "[DONE]"
        r = await c.post("/v1/chat/completions/control", json={
            "model": "alpha", "id": completion, "action": "reasoning_end"})
        assert r.json() == {"success": False, "message": "no active completion for this id"}
