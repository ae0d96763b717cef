"""Requests relayed to the real engines that the daemon's local runner started, on a
private bus: chat, streams chunk by chunk, two models on one keep-alive connection, the
real ``openai`` client, a client gone mid-stream (the engine's slot freed), an engine
that dies mid-stream (the stream ends, with an error)."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time
from pathlib import Path
from typing import Any

import h11
import httpx
import pytest
from support.daemonkit import Running
from support.enginekit import write_config, write_preset

from lokid.core.names import MANAGER_INTERFACE, OBJECT_PATH
from lokid.gateway.server import Gateway
from lokid.runners import local_runner

pytestmark = [pytest.mark.engine, pytest.mark.slow]


@pytest.fixture
def config(tmp_path: Path, engine: str, models: Any, ports: dict[str, int]) -> Path:
    # the llama trained for 32k: the engine caps a slot at the training length (4096 for
    # the plain one, about 3 s of tokens), and long_stream() must still be generating,
    # past what the sockets buffer, when the client goes (it was not, twice, under load)
    assert Path(models.llama_long).name == "llama-long.gguf"
    config = write_config(tmp_path, engine, [models.dir])
    for name, port in ports.items():
        write_preset(config, name, f'model = "llama-long.gguf"\nctx = 32768\nport = {port}\n')
    return config


async def start(running: Running, *names: str) -> None:
    manager = await running.iface(OBJECT_PATH, MANAGER_INTERFACE)
    for name in names:
        await manager.call_start_preset(name)
    for name in names:
        await running.wait_event(name, "ready")


def chat(model: str, **kw: Any) -> dict[str, Any]:
    return {"model": model, "messages": [{"role": "user", "content": "Hello"}],
            "max_tokens": 8, "temperature": 0, "seed": 1, **kw}


async def ready_in_gateway(gw: Gateway, *names: str) -> None:
    deadline = time.monotonic() + 10
    while any(gw.presets.presets[n].state != "ready" for n in names):
        assert time.monotonic() < deadline, {n: gw.presets.presets[n].state for n in names}
        await asyncio.sleep(0.02)


async def test_chat_stream_and_models(running: Running, gateway: Gateway) -> None:
    await start(running, "alpha")
    await ready_in_gateway(gateway, "alpha")
    async with httpx.AsyncClient(base_url=gateway.url, timeout=60) as c:  # type: ignore[attr-defined]
        states = {m["id"]: m["lokid"]["state"] for m in (await c.get("/v1/models")).json()["data"]}
        assert states == {"alpha": "ready", "beta": "inactive"}
        r = await c.post("/v1/chat/completions", json=chat("alpha"))
        assert r.status_code == 200, r.text
        assert r.json()["model"] == "alpha" and r.json()["choices"][0]["message"]["content"]
        # llama.cpp's own routes too
        r = await c.post("/tokenize", json={"model": "alpha", "content": "hi"})
        assert r.status_code == 200 and r.json()["tokens"]
        r = await c.get("/props", params={"model": "alpha"})
        assert r.status_code == 200 and "default_generation_settings" in r.json()
        # a stream: events arrive as the engine sends them, each its own chunk
        chunks: list[bytes] = []
        async with c.stream("POST", "/v1/chat/completions",
                            json=chat("alpha", stream=True, max_tokens=16)) as s:
            assert s.headers["content-type"].startswith("text/event-stream")
            async for chunk in s.aiter_raw():
                chunks.append(chunk)
        text = b"".join(chunks).decode()
        events = [line[6:] for line in text.splitlines() if line.startswith("data: ")]
        assert events[-1] == "[DONE]" and len(events) >= 10
        # passed on as they come, not gathered into one answer: a long stream arrives in
        # many reads, its first event well before its end
        chunks, times = [], []
        async with c.stream("POST", "/completion", json={**long_stream("alpha"),
                                                         "n_predict": 1500}) as s:
            async for chunk in s.aiter_raw():
                chunks.append(chunk)
                times.append(time.monotonic())
        assert len(chunks) >= 20 and b"\"tokens_predicted\":1500" in chunks[-1]
        assert times[-1] - times[0] > 0.05
        deltas = [json.loads(e)["choices"][0]["delta"] for e in events[:-1]]
        assert any(d.get("content") for d in deltas)
        # a model that is not running is not started: it is not on demand
        r = await c.post("/v1/chat/completions", json=chat("beta"))
        assert r.status_code == 503 and "lokictl start beta" in r.json()["error"]["message"]


async def test_two_models_on_one_keep_alive_connection(running: Running,
                                                       gateway: Gateway) -> None:
    await start(running, "alpha", "beta")
    await ready_in_gateway(gateway, "alpha", "beta")
    port = gateway.settings.listen[0][1]
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    conn = h11.Connection(h11.CLIENT)
    try:
        for model in ("alpha", "beta", "alpha"):
            body = json.dumps(chat(model)).encode()
            writer.write(conn.send(h11.Request(method="POST", target="/v1/chat/completions",
                                               headers=[("Host", "127.0.0.1"),
                                                        ("Content-Type", "application/json"),
                                                        ("Content-Length", str(len(body)))])))
            writer.write(conn.send(h11.Data(data=body)) + conn.send(h11.EndOfMessage()))
            await writer.drain()
            status, data = 0, b""
            while True:
                event = conn.next_event()
                if event is h11.NEED_DATA:
                    conn.receive_data(await asyncio.wait_for(reader.read(65536), 60))
                elif isinstance(event, h11.Response):
                    status = event.status_code
                elif isinstance(event, h11.Data):
                    data += event.data
                elif isinstance(event, h11.EndOfMessage):
                    break
            assert status == 200 and json.loads(data)["model"] == model
            assert conn.our_state is h11.DONE and conn.their_state is h11.DONE
            conn.start_next_cycle()   # the same connection, the next request
    finally:
        writer.close()


async def test_the_openai_client(running: Running, gateway: Gateway) -> None:
    import openai

    await start(running, "alpha")
    await ready_in_gateway(gateway, "alpha")
    client = openai.AsyncOpenAI(base_url=gateway.url + "/v1", api_key="unused")  # type: ignore[attr-defined]
    try:
        listed = {m.id: m for m in (await client.models.list()).data}
        assert set(listed) == {"alpha", "beta"}
        reply = await client.chat.completions.create(
            model="alpha", messages=[{"role": "user", "content": "Hello"}], max_tokens=8,
            temperature=0)
        assert reply.model == "alpha" and reply.choices[0].message.content
        stream = await client.chat.completions.create(
            model="alpha", messages=[{"role": "user", "content": "Hello"}], max_tokens=16,
            temperature=0, stream=True)
        pieces = [c.choices[0].delta.content async for c in stream if c.choices]
        assert len(pieces) >= 5 and "".join(p or "" for p in pieces)
        with pytest.raises(openai.NotFoundError, match="alpha"):
            await client.chat.completions.create(model="nope", messages=[], max_tokens=1)
    finally:
        await client.close()


async def slots_busy(url: str) -> int:
    async with httpx.AsyncClient(timeout=5) as c:
        return sum(1 for s in (await c.get(url + "/slots")).json() if s["is_processing"])


def long_stream(model: str) -> dict[str, Any]:
    return {"model": model, "prompt": "Once", "n_predict": 30000, "ignore_eos": True,
            "stream": True, "temperature": 1.0}


async def test_a_client_gone_mid_stream_frees_the_engine_slot(
        running: Running, gateway: Gateway, ports: dict[str, int]) -> None:
    await start(running, "alpha")
    await ready_in_gateway(gateway, "alpha")
    engine = f"http://127.0.0.1:{ports['alpha']}"
    async with httpx.AsyncClient(base_url=gateway.url, timeout=60) as c:  # type: ignore[attr-defined]
        async with c.stream("POST", "/completion", json=long_stream("alpha")) as s:
            assert s.status_code == 200
            got, text = 0, b""
            # read by hand, not `async for … break`: leaving the loop closes the generator,
            # and httpcore closes the connection on that, so the client was already gone
            # when the premise below was checked (it failed 1 run in 3 on a quiet machine)
            chunks = s.aiter_raw()
            while got < 20:
                chunk = await chunks.__anext__()
                got += chunk.count(b"data: ")
                text = (text + chunk)[-4096:]
            # the premise: the engine still generates for this client
            busy = [await slots_busy(engine) for _ in range(3)]
            assert 1 in busy, (busy, got, text[-300:])
            await s.aclose()
        # the connection is closed here, the answer unread
    gone = time.monotonic()
    while await slots_busy(engine):
        assert time.monotonic() - gone < 1.0, "the engine's slot is still busy after 1 s"
        await asyncio.sleep(0.05)


async def test_an_engine_dying_mid_stream_ends_the_stream(
        running: Running, gateway: Gateway, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(local_runner, "RESTART_SEC", 30)
    await start(running, "alpha")
    await ready_in_gateway(gateway, "alpha")
    runner = running.daemon.runner
    assert isinstance(runner, local_runner.LocalRunner)
    proc = runner.engines["alpha"].proc
    assert proc is not None
    with open(f"/proc/{proc.pid}/task/{proc.pid}/children") as f:
        (engine_pid,) = (int(p) for p in f.read().split())
    async with httpx.AsyncClient(base_url=gateway.url, timeout=30) as c:  # type: ignore[attr-defined]
        text, killed = b"", False
        async with c.stream("POST", "/completion", json=long_stream("alpha")) as s:
            async for chunk in s.aiter_raw():
                text += chunk
                if not killed and text.count(b"data: ") >= 5:
                    os.kill(engine_pid, signal.SIGKILL)
                    killed = True
        assert b'"stop":true' not in text   # it did not run to its end
        events = [line[6:] for line in text.decode().splitlines() if line.startswith("data: ")]
        assert "error" in json.loads(events[-1]), events[-3:]
        assert "failed mid-answer" in json.loads(events[-1])["error"]["message"]
