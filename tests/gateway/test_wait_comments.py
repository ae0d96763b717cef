"""A streaming client that waits is told so (issue 46, item 4; ``[gateway] wait_comments``),
through the real gateway, the real daemon and the real llama-server with ``-np 1``: while
one key's stream holds the only slot, another key's streaming request gets the gateway's
200 head and SSE comment lines saying its place, then the engine's events in the same
response, read by httpx and by the ``openai`` package (which ignores the comments); an
engine's error after the head is the last event; a request served at once, and any
request with the option off, gets the engine's answer as before, with no comment."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from support.enginekit import write_config, write_preset
from support.gatewaykit import gateway_on, until

from lokid.core.serve.keys import digest
from lokid.gateway.server import Gateway
from lokid.gateway.waitnotes import FIRST

pytestmark = [pytest.mark.engine, pytest.mark.slow]

KEYS = {"alice": "sk-loki-alice-0000000000000000000000000000000",
        "bob": "sk-loki-bob-000000000000000000000000000000000"}
# tokens: the holder's stream holds the only slot until it is cut. The tiny model writes
# ~1,500 a second here, and llama.gguf's 4,096 context ended a holder within the 3 s the
# tests wait: llama-long.gguf (32,768) holds it ~20 s
LONG = 30000


@pytest.fixture
def config(tmp_path: Path, engine: str, models: Any, ports: dict[str, int]) -> Path:
    config = write_config(tmp_path, engine, [models.dir])
    assert Path(models.llama_long).name == "llama-long.gguf"   # made on first use
    write_preset(config, "alpha", f'model = "llama-long.gguf"\nctx = 32768\n'
                 f'port = {ports["alpha"]}\n'
                 'extra_args = ["-np", "1"]\n[serve]\non_demand = true\n')
    return config


@pytest.fixture
def keys_file(tmp_path: Path) -> Path:
    path = tmp_path / "keys.toml"
    path.write_text("".join(f'[keys.{name}]\nhash = "{digest(secret)}"\n\n'
                            for name, secret in KEYS.items()))
    return path


def auth(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {KEYS[key]}"}


def chat(tokens: int, **extra: Any) -> dict[str, Any]:
    return {"model": "alpha", "messages": [{"role": "user", "content": "Hello"}],
            "max_tokens": tokens, "stream": True, "ignore_eos": True, **extra}


async def until_running(gw: Gateway, n: int) -> None:
    await until(lambda: _true(gw.admission.share.running("alpha") == n), 30,
                f"{n} in the only slot")


@pytest.fixture
async def held(running: Any, bus_address: str, keys_file: Path
               ) -> AsyncIterator[tuple[Gateway, httpx.AsyncClient, Any]]:
    """A gateway with wait_comments on, its engine warm; ``hold()`` starts alice's long
    stream in the only slot and returns a function that cuts it."""
    async with gateway_on(bus_address, keys_file=str(keys_file), wait_comments=True) as gw, \
            httpx.AsyncClient(base_url=gw.url, timeout=120) as c:  # type: ignore[attr-defined]
        r = await c.post("/v1/chat/completions", headers=auth("alice"),
                         json={**chat(1), "stream": False})
        assert r.status_code == 200, r.text   # started, warm
        holders: list[asyncio.Task[Any]] = []

        async def hold() -> Any:
            async def stream() -> None:
                async with httpx.AsyncClient(base_url=gw.url, timeout=120) as own, \
                        own.stream("POST", "/v1/chat/completions", headers=auth("alice"),
                                   json=chat(LONG)) as r:
                    await r.aread()
            task = asyncio.create_task(stream())
            holders.append(task)
            await until_running(gw, 1)

            async def cut() -> None:
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
            return cut

        yield gw, c, hold
        for t in holders:
            t.cancel()
        await asyncio.gather(*holders, return_exceptions=True)


async def test_a_waiting_stream_is_told_its_place_then_gets_the_engines_events(
        held: tuple[Gateway, httpx.AsyncClient, Any]) -> None:
    gw, c, hold = held
    cut = await hold()
    lines: list[str] = []
    async with c.stream("POST", "/v1/chat/completions", headers=auth("bob"),
                        json=chat(8)) as r:
        # the gateway's head, sent while the request still waits at the gate
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/event-stream")
        assert gw.admission.waiting() == {"alpha": 1}
        it = r.aiter_lines()
        first = await it.__anext__()
        assert first == ": waiting, 0 ahead (slots busy (1/1)), about " + first.split(
            "about ")[-1], first
        assert first.endswith(" s")
        assert gw.admission.waiting() == {"alpha": 1}   # still waiting when told
        await cut()   # the slot freed: bob's request goes to the engine
        async for line in it:
            lines.append(line)
    events = [json.loads(x[len("data: "):]) for x in lines
              if x.startswith("data: ") and x != "data: [DONE]"]
    assert "data: [DONE]" in lines, lines
    assert events and all(e["object"] == "chat.completion.chunk" for e in events), lines
    assert events[-1].get("usage") or events[-1]["choices"][0].get("finish_reason"), lines
    assert not any(x.startswith("data: ") and "error" in x for x in lines), lines


async def test_the_openai_client_ignores_the_comments(
        held: tuple[Gateway, httpx.AsyncClient, Any]) -> None:
    openai = pytest.importorskip("openai", reason="the openai package is not in this venv")
    gw, _, hold = held
    cut = await hold()
    client = openai.AsyncOpenAI(base_url=gw.url + "/v1",  # type: ignore[attr-defined]
                                api_key=KEYS["bob"], max_retries=0)
    stream = await client.chat.completions.create(   # its head: the gateway's
        model="alpha", messages=[{"role": "user", "content": "Hello"}], max_tokens=8,
        stream=True, extra_body={"ignore_eos": True})

    async def cut_once_told() -> None:   # FIRST s and more: at least one comment sent
        await asyncio.sleep(FIRST + 1.0)
        assert gw.admission.waiting() == {"alpha": 1}
        await cut()

    cutter = asyncio.create_task(cut_once_told())
    chunks = [chunk async for chunk in stream]
    await cutter
    assert chunks and all(ch.object == "chat.completion.chunk" for ch in chunks)
    text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
    assert text, chunks
    await client.close()


async def test_an_engines_error_after_the_head_is_the_last_event(
        held: tuple[Gateway, httpx.AsyncClient, Any]) -> None:
    gw, c, hold = held
    bad = {**chat(8), "messages": "not a list"}   # llama-server refuses it
    refused = await c.post("/v1/chat/completions", headers=auth("bob"), json=bad)
    assert refused.status_code >= 400 and "error" in refused.json()   # at once: as it is
    cut = await hold()
    async with c.stream("POST", "/v1/chat/completions", headers=auth("bob"), json=bad) as r:
        assert r.status_code == 200   # the gateway's head, sent while it waited
        it = r.aiter_lines()
        assert (await it.__anext__()).startswith(": waiting, 0 ahead")
        await cut()
        lines = [line async for line in it]
    data = [x for x in lines if x.startswith("data: ")]
    assert len(data) == 1, lines
    assert json.loads(data[0][len("data: "):]) == refused.json(), lines


async def test_a_request_served_at_once_or_with_the_option_off_is_not_told(
        held: tuple[Gateway, httpx.AsyncClient, Any], bus_address: str,
        keys_file: Path) -> None:
    gw, c, hold = held
    async with c.stream("POST", "/v1/chat/completions", headers=auth("bob"),
                        json=chat(8)) as r:
        lines = [line async for line in r.aiter_lines()]
    assert not any(x.startswith(":") for x in lines) and "data: [DONE]" in lines, lines
    async with gateway_on(bus_address, keys_file=str(keys_file)) as off, \
            httpx.AsyncClient(base_url=off.url, timeout=120) as oc:  # type: ignore[attr-defined]
        cut = await hold()
        task = asyncio.create_task(oc.post("/v1/chat/completions", headers=auth("bob"),
                                           json=chat(8)))
        await asyncio.sleep(FIRST + 1.0)
        assert not task.done()   # no head while it waits
        await cut()
        r = await task
        assert r.status_code == 200
        assert not any(x.startswith(":") for x in r.text.splitlines()), r.text


async def _true(value: bool) -> bool:
    return value
