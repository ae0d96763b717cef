"""External presets through the real gateway (issue 22, item 5): a SECOND real
llama-server on loopback, started with ``--api-key``, is the external API; the daemon
(its local runner, a private session bus) lists it, and the real ``openai`` client asks
the gateway for it by the preset's name. The upstream key reaches it from the preset's
api_key_file, never over D-Bus, in a log or a reply; a missing key file, an API that
does not answer and one that refuses the key each give a clear error. And a keyed
engine preset behind a keyed gateway gets its own key, not the client's."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from dbus_fast import Message, MessageType
from support.daemonkit import Running
from support.enginekit import Engine, free_port, write_config, write_preset
from support.enginekit import running as engine_running
from support.gatewaykit import app_on_loopback, gateway_on

from lokid.core.names import MANAGER_INTERFACE, OBJECT_PATH, PRESET_INTERFACE
from lokid.gateway.server import Gateway

pytestmark = [pytest.mark.engine, pytest.mark.slow]

SECRET = "sk-upstream-7f3a9c"        # the external API's key
ENGINE_KEY = "sk-local-engine-41d2"  # the keyed local engine's own key
CLIENT_KEY = "client-key-for-the-gateway"


@pytest.fixture
def upstream(engine: str, models: Any, tmp_path: Path) -> Iterator[Engine]:
    """The external API: a real llama-server on loopback that wants SECRET."""
    port = free_port()
    with engine_running([engine, "-m", models.llama, "--host", "127.0.0.1", "--port",
                         str(port), "-c", "2048", "--api-key", SECRET],
                        tmp_path / "upstream.log") as e:
        yield e


@pytest.fixture
async def recorder() -> AsyncIterator[tuple[str, list[tuple[dict[str, Any], dict[str, str]]]]]:
    """An OpenAI-compatible API (a real aiohttp server) that keeps what it was sent: the
    llama-server above answers any model name and logs no header, so what the gateway
    sends upstream (the model, the key) is read here."""
    from aiohttp import web

    seen: list[tuple[dict[str, Any], dict[str, str]]] = []

    async def chat(request: web.Request) -> web.Response:
        body = await request.json()
        seen.append((body, dict(request.headers)))
        return web.json_response({"id": "r1", "object": "chat.completion", "created": 0,
                                  "model": body["model"], "choices": [{
                                      "index": 0, "finish_reason": "stop", "message": {
                                          "role": "assistant", "content": "recorded"}}]})

    app = web.Application()
    app.router.add_post("/v1/chat/completions", chat)
    async with app_on_loopback(app) as url:
        yield f"{url}/v1", seen


@pytest.fixture
def config(tmp_path: Path, engine: str, models: Any, upstream: Engine,
           recorder: tuple[str, list[Any]]) -> Path:
    config = write_config(tmp_path, engine, [models.dir])
    keys = tmp_path / "keys"
    keys.mkdir()
    (keys / "remote.key").write_text(f"# the upstream's key\n{SECRET}\n")
    (keys / "remote.key").chmod(0o600)
    (keys / "local.key").write_text(ENGINE_KEY + "\n")
    url = upstream.url + "/v1"
    write_preset(config, "remote", f'kind = "external"\nurl = "{url}"\nupstream_model = '
                 f'"tiny-upstream"\napi_key_file = "{keys}/remote.key"\n')
    write_preset(config, "nokey", f'kind = "external"\nurl = "{url}"\n')
    write_preset(config, "recorded", f'kind = "external"\nurl = "{recorder[0]}"\n'
                 f'upstream_model = "up-model"\napi_key_file = "{keys}/remote.key"\n')
    write_preset(config, "lostkey", f'kind = "external"\nurl = "{url}"\n'
                 f'api_key_file = "{keys}/missing.key"\n')
    write_preset(config, "down", f'kind = "external"\nurl = "http://127.0.0.1:{free_port()}/v1"\n')
    write_preset(config, "local", f'model = "llama.gguf"\nctx = 2048\nport = {free_port()}\n'
                 f'api_key_file = "{keys}/local.key"\n')
    return config


async def reachable(gw: Gateway, name: str, prefix: str, timeout: float = 15) -> None:
    deadline = time.monotonic() + timeout
    while not gw.presets.presets[name].reachable.startswith(prefix):
        assert time.monotonic() < deadline, gw.presets.presets[name].reachable
        await asyncio.sleep(0.05)


async def test_the_openai_client_reaches_the_external_api_with_its_key(
        running: Running, bus_address: str, upstream: Engine,
        caplog: pytest.LogCaptureFixture, capfd: pytest.CaptureFixture[str]) -> None:
    import openai

    caplog.set_level("DEBUG")
    async with gateway_on(bus_address) as gw:
        await reachable(gw, "remote", "reachable")
        await reachable(gw, "down", "unreachable")
        client = openai.AsyncOpenAI(base_url=gw.url + "/v1", api_key="unused")  # type: ignore[attr-defined]
        try:
            listed = {m.id: m.model_extra["lokid"] for m in (await client.models.list()).data}
            assert listed["remote"]["state"] == "external"
            # its state in words, not its host (issue 28, item 12): that is the operator's
            assert listed["remote"]["status"].startswith("reachable (GET <address>")
            assert upstream.url not in str(listed)
            assert listed["down"]["status"].startswith("unreachable")
            assert listed["local"]["state"] == "inactive"
            reply = await client.chat.completions.create(
                model="remote", messages=[{"role": "user", "content": "Hello"}], max_tokens=8,
                temperature=0)
            assert reply.choices[0].message.content
            stream = await client.chat.completions.create(
                model="remote", messages=[{"role": "user", "content": "Hello"}],
                max_tokens=16, temperature=0, stream=True)
            pieces = [c.choices[0].delta.content async for c in stream if c.choices]
            assert len(pieces) >= 5 and "".join(p or "" for p in pieces)
            # no key file: the request goes without a key, and the API's own refusal passes
            with pytest.raises(openai.AuthenticationError):
                await client.chat.completions.create(model="nokey", messages=[{
                    "role": "user", "content": "Hello"}], max_tokens=1)
            # a key file that is not there: a clear 503 naming the preset, not a request
            # sent without its key
            with pytest.raises(openai.InternalServerError) as lost:
                await client.chat.completions.create(model="lostkey", messages=[{
                    "role": "user", "content": "Hello"}], max_tokens=1)
            assert lost.value.status_code == 503
            assert "preset 'lostkey': its api_key_file cannot be used" in str(lost.value)
            assert "missing.key: cannot use its api_key_file" not in caplog.text  # a path...
            assert "preset lostkey: cannot use its api_key_file" in caplog.text   # ...in the log
            # an API nobody answers at: 502 naming the preset
            with pytest.raises(openai.APIStatusError) as down:
                await client.chat.completions.create(model="down", messages=[{
                    "role": "user", "content": "Hello"}], max_tokens=1)
            assert down.value.status_code == 502 and "preset 'down'" in str(down.value)
        finally:
            await client.close()
        async with httpx.AsyncClient(base_url=gw.url, timeout=30) as c:  # type: ignore[attr-defined]
            # llama.cpp's own routes mean nothing to another API
            r = await c.post("/tokenize", json={"model": "remote", "content": "hi"})
            assert r.status_code == 404
            assert "only the OpenAI inference routes" in r.json()["error"]["message"]
            # no start for it, ever
            r = await c.post("/v1/chat/completions", json={"model": "remote", "messages": [
                {"role": "user", "content": "Hi"}], "max_tokens": 1})
            assert r.status_code == 200
    assert running.daemon.runner is not None
    assert running.daemon.runner.state("remote").state == "inactive"
    await no_secret_on_the_bus(running, SECRET)
    out, err = capfd.readouterr()
    assert SECRET not in caplog.text and SECRET not in out + err


async def no_secret_on_the_bus(running: Running, *secrets: str) -> None:
    """Every property of the manager and of every preset object, and every Plan() and
    Notes, read as any caller reads them: none holds a secret."""
    bus = running.client

    async def call(path: str, interface: str, member: str, signature: str = "",
                   body: list[Any] | None = None) -> Message:
        return await bus.call(Message(destination="org.lokid.Lokid1", path=path,
                                      interface=interface, member=member,
                                      signature=signature, body=body or []))

    seen = []
    reply = await call(OBJECT_PATH, "org.freedesktop.DBus.Properties", "GetAll", "s",
                       [MANAGER_INTERFACE])
    seen.append(repr(reply.body))
    for path in reply.body[0]["Presets"].value:
        props = await call(path, "org.freedesktop.DBus.Properties", "GetAll", "s",
                           [PRESET_INTERFACE])
        assert props.message_type == MessageType.METHOD_RETURN
        seen.append(repr(props.body))
        plan = await call(path, PRESET_INTERFACE, "Plan")
        seen.append(repr(plan.body))
    text = "\n".join(seen)
    assert "remote.key" in text   # the KeyFile path is there, the key is not
    for secret in secrets:
        assert secret not in text


async def test_a_keyed_gateway_sends_a_keyed_engine_its_own_key(
        running: Running, bus_address: str, capfd: pytest.CaptureFixture[str],
        caplog: pytest.LogCaptureFixture, recorder: tuple[str, list[Any]]) -> None:
    """The client's key is for the gateway; the engine wants the preset's api_key_file:
    on today's main the gateway dropped the client's and sent none (the engine: 401)."""
    manager = await running.iface(OBJECT_PATH, MANAGER_INTERFACE)
    await manager.call_start_preset("local")
    await running.wait_event("local", "ready")
    async with gateway_on(bus_address, keys=frozenset({CLIENT_KEY})) as gw:
        deadline = time.monotonic() + 10
        while gw.presets.presets["local"].state != "ready":
            assert time.monotonic() < deadline
            await asyncio.sleep(0.02)
        async with httpx.AsyncClient(base_url=gw.url, timeout=60) as c:  # type: ignore[attr-defined]
            body = {"model": "local", "messages": [{"role": "user", "content": "Hi"}],
                    "max_tokens": 4}
            r = await c.post("/v1/chat/completions", json=body,
                             headers={"Authorization": f"Bearer {CLIENT_KEY}"})
            assert r.status_code == 200, r.text
            assert r.json()["choices"][0]["message"]["content"] is not None
            # and the external one behind the same keyed gateway: its key, not the client's
            r = await c.post("/v1/chat/completions", json={**body, "model": "remote"},
                             headers={"Authorization": f"Bearer {CLIENT_KEY}"})
            assert r.status_code == 200, r.text
            # what the external API was sent: its model name, its key, nothing else kept
            r = await c.post("/v1/chat/completions?x=1", json={**body, "model": "recorded"},
                             headers={"Authorization": f"Bearer {CLIENT_KEY}"})
            # the API was asked for up-model; the client reads the preset's name (issue 28,
            # item 17: a reply said "up-model", which no client asked for)
            assert r.status_code == 200 and r.json()["model"] == "recorded", r.text
            (sent, headers), = recorder[1]
            assert sent == {**body, "model": "up-model"}
            assert headers["Authorization"] == f"Bearer {SECRET}"
            assert CLIENT_KEY not in repr(headers)
            r = await c.post("/v1/chat/completions", json=body)
            assert r.status_code == 401   # the gateway's own check still holds
    await no_secret_on_the_bus(running, SECRET, ENGINE_KEY)
    out, err = capfd.readouterr()
    assert ENGINE_KEY not in caplog.text + out + err and SECRET not in caplog.text + out + err
    assert json.dumps(ENGINE_KEY) not in caplog.text
