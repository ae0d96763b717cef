"""Usage of an external preset (issue 46, item 2): a second real llama-server on loopback is
the external API (as in test_external_gateway.py); its answers come through the relay's
path (not the tunnel: an external API's model is renamed as it passes), whole and
streamed, and are counted from their own figures, ``where`` external."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from support.daemonkit import Running
from support.enginekit import Engine, free_port, write_config, write_preset
from support.enginekit import running as engine_running

from lokid.gateway.figures import Figures
from lokid.gateway.server import Gateway
from lokid.gateway.usage import utc_day

pytestmark = [pytest.mark.engine, pytest.mark.slow]


@pytest.fixture
def upstream(engine: str, models: Any, tmp_path: Path) -> Iterator[Engine]:
    with engine_running([engine, "-m", models.llama, "--host", "127.0.0.1", "--port",
                         str(free_port()), "-c", "2048"], tmp_path / "upstream.log") as e:
        yield e


@pytest.fixture
def config(tmp_path: Path, engine: str, models: Any, upstream: Engine) -> Path:
    config = write_config(tmp_path, engine, [models.dir])
    write_preset(config, "remote", f'kind = "external"\nurl = "{upstream.url}/v1"\n'
                 'upstream_model = "tiny-upstream"\n')
    return config


async def test_an_external_answer_is_counted_from_its_figures(running: Running,
                                                              gateway: Gateway) -> None:
    deadline = time.monotonic() + 15
    while not gateway.presets.presets["remote"].reachable.startswith("reachable"):
        assert time.monotonic() < deadline, gateway.presets.presets["remote"].reachable
        await asyncio.sleep(0.05)
    gateway.report.usage = None
    got: list[Figures | None] = []
    gateway.usage.hooks.append(lambda _i, _p, f: got.append(f))
    wheres: list[str] = []
    gateway.usage.audit.send = lambda _m, **fields: wheres.append(fields["LOKID_WHERE"])
    body = {"model": "remote", "messages": [{"role": "user", "content": "Hi there"}],
            "max_tokens": 8, "temperature": 0}
    async with httpx.AsyncClient(base_url=gateway.url, timeout=60) as c:  # type: ignore[attr-defined]
        r = await c.post("/v1/chat/completions", json=body)
        assert r.status_code == 200, r.text
        t = r.json()["timings"]
        assert got[-1] is not None
        assert (got[-1].prompt_tokens, got[-1].generated_tokens) == \
            (t["prompt_n"] + t["cache_n"], t["predicted_n"])
        raw = b""
        async with c.stream("POST", "/v1/chat/completions", json={
                **body, "stream": True, "stream_options": {"include_usage": True}}) as s:
            async for chunk in s.aiter_raw():
                raw += chunk
        evs = [json.loads(line[6:]) for line in raw.decode().splitlines()
               if line.startswith("data: {")]
        assert len(evs) >= 8
        u = [e["usage"] for e in evs if e.get("usage")][-1]
        assert got[-1] is not None
        assert (got[-1].prompt_tokens, got[-1].generated_tokens) == \
            (u["prompt_tokens"], u["completion_tokens"])
    row = gateway.usage.pending[(utc_day(time.time()), "anonymous", "remote")]
    assert row["requests"] == 2 and row["peer_requests"] == 0
    assert row["generated_tokens"] == t["predicted_n"] + u["completion_tokens"]
    assert wheres == ["external", "external"]
