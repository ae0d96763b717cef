"""Usage from the engine's own figures (issue 46, item 2), through the real gateway to the
real engine the daemon's local runner started, on a private bus: each answer's counts
equal the ``timings`` (or ``usage``) the client received, to the token, for a whole
chat answer, a streamed one, one with ``stream_options.include_usage``, an embeddings
answer and a prompt served from the engine's cache; a client gone mid-stream is counted
499 with what its answer had said (nothing: llama-server's figures come in a stream's
last event); the rows the report hands the daemon."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from support.daemonkit import Running
from support.enginekit import write_config, write_preset

from lokid.core.names import MANAGER_INTERFACE, OBJECT_PATH
from lokid.gateway.figures import Figures
from lokid.gateway.server import Gateway
from lokid.gateway.usage import utc_day

pytestmark = [pytest.mark.engine, pytest.mark.slow]


@pytest.fixture
def config(tmp_path: Path, engine: str, models: Any, ports: dict[str, int]) -> Path:
    assert Path(models.llama_long).name == "llama-long.gguf"   # written on first use
    assert Path(models.llama).name == "llama.gguf"
    config = write_config(tmp_path, engine, [models.dir])
    write_preset(config, "alpha", f'model = "llama-long.gguf"\nctx = 32768\n'
                 f'port = {ports["alpha"]}\n')
    write_preset(config, "beta", f'model = "llama.gguf"\nport = {ports["beta"]}\n'
                 'extra_args = ["--embeddings", "--pooling", "mean"]\n')
    return config


async def start(running: Running, gw: Gateway, *names: str) -> None:
    manager = await running.iface(OBJECT_PATH, MANAGER_INTERFACE)
    for name in names:
        await manager.call_start_preset(name)
    for name in names:
        await running.wait_event(name, "ready")
    deadline = time.monotonic() + 10
    while any(gw.presets.presets[n].state != "ready" for n in names):
        assert time.monotonic() < deadline, {n: gw.presets.presets[n].state for n in names}
        await asyncio.sleep(0.02)


def chat(model: str, text: str = "Hello", **kw: Any) -> dict[str, Any]:
    return {"model": model, "messages": [{"role": "user", "content": text}],
            "max_tokens": 12, "temperature": 0, "seed": 1, **kw}


def from_timings(t: dict[str, Any]) -> tuple[int, int, int]:
    """(prompt, cached, generated) as the client read them in the engine's timings."""
    return t["prompt_n"] + t["cache_n"], t["cache_n"], t["predicted_n"]


def seen(f: Figures | None) -> tuple[int, int, int]:
    assert f is not None and f.known, f
    return f.prompt_tokens, f.cached_tokens, f.generated_tokens


def events(raw: bytes) -> list[dict[str, Any]]:
    out = []
    for line in raw.decode().splitlines():
        if line.startswith("data: ") and line[6:] != "[DONE]":
            out.append(json.loads(line[6:]))
    return out


async def test_counts_are_the_engines_own(running: Running, gateway: Gateway) -> None:
    await start(running, gateway, "alpha", "beta")
    got: list[tuple[Any, str, Figures | None]] = []
    gateway.usage.hooks.append(lambda identity, preset, f: got.append((identity, preset, f)))
    gateway.report.usage = None   # the rows stay here to be read (no report taken)
    expected = {"prompt_tokens": 0, "cached_tokens": 0, "generated_tokens": 0}
    engine_ms = 0.0

    def add(p: int, c: int, g: int) -> None:
        expected["prompt_tokens"] += p
        expected["cached_tokens"] += c
        expected["generated_tokens"] += g

    async with httpx.AsyncClient(base_url=gateway.url, timeout=60) as c:  # type: ignore[attr-defined]
        # a whole answer
        r = await c.post("/v1/chat/completions", json=chat("alpha", "Tell me a story"))
        assert r.status_code == 200, r.text
        t = r.json()["timings"]
        assert seen(got[-1][2]) == from_timings(t) and got[-1][1] == "alpha"
        assert t["predicted_n"] > 0
        add(*from_timings(t))
        engine_ms += t["prompt_ms"] + t["predicted_ms"]
        # the same prompt again: its prompt comes from the engine's cache, counted whole
        r = await c.post("/v1/chat/completions", json=chat("alpha", "Tell me a story"))
        t = r.json()["timings"]
        assert t["cache_n"] > 0, t
        assert seen(got[-1][2]) == from_timings(t)
        add(*from_timings(t))
        engine_ms += t["prompt_ms"] + t["predicted_ms"]
        # a stream (carried as bytes by the tunnel): its last event's timings
        for extra in ({}, {"stream_options": {"include_usage": True}}):
            raw = b""
            async with c.stream("POST", "/v1/chat/completions",
                                json=chat("alpha", "Once upon", stream=True, max_tokens=40,
                                          ignore_eos=True, **extra)) as s:
                assert s.status_code == 200
                async for chunk in s.aiter_raw():
                    raw += chunk
            evs = events(raw)
            t = [e["timings"] for e in evs if "timings" in e][-1]
            assert seen(got[-1][2]) == from_timings(t), (extra, evs[-2:])
            assert t["predicted_n"] == 40
            if extra:   # OpenAI's usage chunk says the same
                u = [e["usage"] for e in evs if e.get("usage")][-1]
                assert (u["prompt_tokens"], u["completion_tokens"]) == \
                    (from_timings(t)[0], from_timings(t)[2])
            add(*from_timings(t))
            engine_ms += t["prompt_ms"] + t["predicted_ms"]
        # llama.cpp's own /completion, streamed
        raw = b""
        async with c.stream("POST", "/completion", json={
                "model": "alpha", "prompt": "Once", "n_predict": 25, "ignore_eos": True,
                "stream": True}) as s:
            async for chunk in s.aiter_raw():
                raw += chunk
        t = [e["timings"] for e in events(raw) if "timings" in e][-1]
        assert seen(got[-1][2]) == from_timings(t) and t["predicted_n"] == 25
        add(*from_timings(t))
        engine_ms += t["prompt_ms"] + t["predicted_ms"]
        # embeddings: `usage` only
        r = await c.post("/v1/embeddings", json={"model": "beta", "input": "a few words"})
        assert r.status_code == 200, r.text
        u = r.json()["usage"]
        assert "timings" not in r.json()
        assert seen(got[-1][2]) == (u["prompt_tokens"], 0, 0) and u["prompt_tokens"] > 0
        assert got[-1][1] == "beta"
        # a refusal: counted, no figures
        r = await c.post("/v1/chat/completions", json={"model": "alpha", "messages": 5})
        refused = r.status_code
        assert refused >= 400, r.text
    day = utc_day(time.time())
    rows = gateway.usage.pending
    alpha = rows[(day, "anonymous", "alpha")]
    assert {k: alpha[k] for k in expected} == expected
    assert alpha["requests"] == 6 and alpha["peer_requests"] == 0
    assert abs(alpha["engine_ms"] - engine_ms) <= 5   # each request's rounded to 1 ms
    assert alpha[f"refused_{refused}"] == 1
    beta = rows[(day, "anonymous", "beta")]
    assert beta["requests"] == 1 and beta["prompt_tokens"] == u["prompt_tokens"]
    assert beta["generated_tokens"] == 0


async def test_a_client_gone_mid_stream_is_499(running: Running, gateway: Gateway) -> None:
    """A client that leaves mid-stream: the engine's figures never came (llama-server
    writes them in its last event), so the request is counted with no tokens, refused
    499, and its audit record says it; the engine stopped with the connection."""
    await start(running, gateway, "alpha")
    gateway.report.usage = None
    records: list[dict[str, str]] = []
    gateway.usage.audit.send = lambda message, **fields: records.append(
        {"MESSAGE": message, **fields})
    async with httpx.AsyncClient(base_url=gateway.url, timeout=60) as c:  # type: ignore[attr-defined]
        async with c.stream("POST", "/completion", json={
                "model": "alpha", "prompt": "Once", "n_predict": 30000, "ignore_eos": True,
                "stream": True}) as s:
            assert s.status_code == 200
            n = 0
            async for _chunk in s.aiter_raw():
                n += 1
                if n >= 5:
                    break
    deadline = time.monotonic() + 10
    while not records:
        assert time.monotonic() < deadline, "no audit record for the client gone"
        await asyncio.sleep(0.05)
    row = gateway.usage.pending[(utc_day(time.time()), "anonymous", "alpha")]
    assert row["requests"] == 1 and row["refused_499"] == 1
    assert row["prompt_tokens"] == row["generated_tokens"] == 0
    (record,) = records
    assert record["LOKID_STATUS"] == "499" and record["LOKID_PRESET"] == "alpha"
    assert record["LOKID_GENERATED_TOKENS"] == "" and record["LOKID_ROUTE"] == "/completion"
    assert record["LOKID_TTFB_MS"] != "" and record["LOKID_WHERE"] == "local"


async def test_the_daemon_keeps_the_counts(running: Running, gateway: Gateway) -> None:
    """The report's GatewayUsage rows, taken by the real daemon (org.lokid.Lokid1.Usage,
    its usage.db) within a few reports: its Usage answer equals the timings the client
    read, to the token, and nothing is left pending in the gateway."""
    from dbus_fast import Variant

    from lokid.core.names import BUS_NAME

    await start(running, gateway, "alpha")
    prompt = generated = cached = 0
    async with httpx.AsyncClient(base_url=gateway.url, timeout=60) as c:  # type: ignore[attr-defined]
        for i in range(3):
            r = await c.post("/v1/chat/completions", json=chat("alpha", f"Count {i % 2}"))
            p, k, g = from_timings(r.json()["timings"])
            prompt, cached, generated = prompt + p, cached + k, generated + g
    usage = await running.iface(OBJECT_PATH, BUS_NAME + ".Usage")
    query = {"by": Variant("as", ["key", "preset"]), "preset": Variant("s", "alpha")}

    async def kept() -> Any:
        rows = [{k: v.value for k, v in row.items()} for row in await usage.call_usage(query)]
        return rows if rows and rows[0].get("requests") == 3 else None

    deadline = time.monotonic() + 15
    while not (rows := await kept()):
        assert time.monotonic() < deadline, "the daemon did not get the counts in 15 s"
        await asyncio.sleep(0.2)
    (row,) = rows
    assert row["key"] == "anonymous" and row["preset"] == "alpha"
    assert (row["prompt_tokens"], row.get("cached_tokens", 0), row["generated_tokens"]) == \
        (prompt, cached, generated)
    assert cached > 0   # the third prompt was the first's: from the engine's cache
    assert not gateway.usage.pending


async def test_anthropic_messages_whole_and_streamed(running: Running, gateway: Gateway) -> None:
    """/v1/messages (Anthropic's shape, no timings): the whole answer's usage, and a stream
    whose prompt is said in its first event and its output in a late one. llama-server
    b11434 leaves message_start out of some streams (1 in 6 to 12 here, asked directly,
    without the gateway): such a stream says no prompt, and is counted with its output
    only; the streams are asked until one has it (at most 10)."""
    await start(running, gateway, "alpha")
    gateway.report.usage = None
    got: list[Figures | None] = []
    gateway.usage.hooks.append(lambda _i, _p, f: got.append(f))
    body = {"model": "alpha", "max_tokens": 30, "messages": [
        {"role": "user", "content": "Say something long"}]}
    async with httpx.AsyncClient(base_url=gateway.url, timeout=60) as c:  # type: ignore[attr-defined]
        r = await c.post("/v1/messages", json=body)
        assert r.status_code == 200, r.text
        u = r.json()["usage"]
        whole = u["input_tokens"] + u.get("cache_read_input_tokens", 0)
        assert seen(got[-1]) == (whole, u.get("cache_read_input_tokens", 0), u["output_tokens"])
        for _ in range(10):
            raw = b""
            async with c.stream("POST", "/v1/messages", json={**body, "stream": True}) as s:
                async for chunk in s.aiter_raw():
                    raw += chunk
            evs = events(raw)
            last = [e["usage"] for e in evs if "usage" in e][-1]
            assert "input_tokens" not in last and last["output_tokens"] > 0   # the output only
            if evs[0].get("type") != "message_start":   # the engine's omission
                assert seen(got[-1]) == (0, 0, last["output_tokens"])
                continue
            first = evs[0]["message"]["usage"]
            assert seen(got[-1]) == (first["input_tokens"] + first["cache_read_input_tokens"],
                                     first["cache_read_input_tokens"], last["output_tokens"])
            assert seen(got[-1])[0] == whole
            break
        else:
            raise AssertionError("no stream of 10 had its message_start")
