"""A batch key's request starts no swap while the holder serves an interactive key's
(issue 46, item 3), through the real gateway, daemon and llama-server: two on-demand
presets in one GPU group with a short ``drain`` (1 s), so that a request waiting for the
other preset would have the holder stopped, its stream cut, one second after it began
to wait. A batch key's request for the other preset waits until the person's stream
has ended whole; an interactive key's request still gets its swap after the drain (the
group's rule is unchanged for it)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import httpx
import pytest
from support.enginekit import write_config, write_preset
from support.gatewaykit import gateway_on, until

from lokid.core.serve.keys import digest

pytestmark = [pytest.mark.engine, pytest.mark.slow]

TOKENS = 3000   # a stream of several seconds: longer than the drain
KEYS = {"alice": "sk-loki-alice-000000000000000000000000000000",
        "bob": "sk-loki-bob-00000000000000000000000000000000",
        "job": "sk-loki-job-00000000000000000000000000000000"}


@pytest.fixture
def config(tmp_path: Path, engine: str, models: Any, ports: dict[str, int]) -> Path:
    assert Path(models.llama).name == "llama.gguf"
    config = write_config(tmp_path, engine, [models.dir])
    for name, port in ports.items():
        write_preset(config, name, f'model = "llama.gguf"\nctx = 8192\nport = {port}\n'
                     '[serve]\non_demand = true\ngroup = "gpu0"\ndrain = "1s"\n')
    return config


@pytest.fixture
def keys_file(tmp_path: Path) -> Path:
    path = tmp_path / "keys.toml"
    path.write_text(f'[keys.alice]\nhash = "{digest(KEYS["alice"])}"\n'
                    f'[keys.bob]\nhash = "{digest(KEYS["bob"])}"\n'
                    f'[keys.job]\nhash = "{digest(KEYS["job"])}"\nclass = "batch"\n')
    return path


def auth(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {KEYS[key]}"}


async def person_streams(c: httpx.AsyncClient, started: asyncio.Event,
                         order: list[str]) -> bytes:
    text = b""
    async with c.stream("POST", "/v1/completions", headers=auth("alice"), json={
            "model": "alpha", "prompt": "Once", "max_tokens": TOKENS, "ignore_eos": True,
            "stream": True}) as s:
        assert s.status_code == 200
        async for chunk in s.aiter_raw():
            text += chunk
            if text.count(b"data: ") >= 5:
                started.set()
    order.append("alice")
    return text


async def other_preset(c: httpx.AsyncClient, key: str, order: list[str]) -> httpx.Response:
    r = await c.post("/v1/completions", headers=auth(key), json={
        "model": "beta", "prompt": "Hi", "max_tokens": 4})
    order.append(key)
    return r


@pytest.mark.parametrize("key,cut", [("job", False), ("bob", True)])
async def test_a_batch_request_does_not_swap_out_a_person(
        running: Any, bus_address: str, keys_file: Path, key: str, cut: bool) -> None:
    async with gateway_on(bus_address, keys_file=str(keys_file)) as gw, \
            httpx.AsyncClient(base_url=gw.url, timeout=600) as c:  # type: ignore[attr-defined]
        r = await c.post("/v1/completions", headers=auth("alice"),
                         json={"model": "alpha", "prompt": "Hi", "max_tokens": 1})
        assert r.status_code == 200, r.text
        order: list[str] = []
        started = asyncio.Event()
        person = asyncio.create_task(person_streams(c, started, order))
        await asyncio.wait_for(started.wait(), 60)
        other = asyncio.create_task(other_preset(c, key, order))
        group = gw.groups.groups["gpu0"]
        await until(lambda: _true(any(w.preset == "beta" for w in group.waiting)), 30,
                    "the other preset's request waiting")
        text, answer = await asyncio.gather(person, other, return_exceptions=True)
        if cut:   # an interactive key: the drain passed, the holder was stopped
            assert group.swaps == 1
            assert isinstance(text, Exception) or b"[DONE]" not in text
        else:     # a batch key: it waited for the person's stream to end whole
            assert isinstance(text, bytes) and b"data: [DONE]" in text, text[-200:]
            assert order == ["alice", "job"]
            assert isinstance(answer, httpx.Response) and answer.status_code == 200
            assert group.swaps == 1   # then the swap, once


async def _true(value: bool) -> bool:
    return value
