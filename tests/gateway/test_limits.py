"""A key's limits through the real gateway, daemon and engine (issue 46, item 4): a rate
per minute reached is 429 rate_limit_exceeded with Retry-After, tokens per minute count
the engine's own figures, a day's budget reached is 429 insufficient_quota naming its
reset, budgets hold across a gateway's restart (the daemon's KeyTotals), and a key
without limits is never refused. The rules alone: test_limits_rules.py."""

from __future__ import annotations

import asyncio
import json
import re
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
from support.enginekit import free_port, write_config, write_preset
from support.gatewaykit import gateway_on, until
from support.sse import data_lines

from lokid.core.names import BUS_NAME, OBJECT_PATH
from lokid.core.serve.keys import digest, new_secret
from lokid.host.buscall import call

pytestmark = [pytest.mark.engine, pytest.mark.slow]

KEYS = {   # name: its limits
    "alice": "",
    "bob": "requests_per_minute = 2\n",
    "tok": "tokens_per_minute = 30\n",
    "day": "tokens_per_day = 20\n",
}


@pytest.fixture
def secrets() -> dict[str, str]:
    return {name: new_secret() for name in KEYS}


@pytest.fixture
def keys_file(tmp_path: Path, secrets: dict[str, str]) -> Path:
    path = tmp_path / "keys.toml"
    path.write_text("".join(f'[keys.{n}]\nhash = "{digest(secrets[n])}"\n{KEYS[n]}\n'
                            for n in KEYS))
    return path


@pytest.fixture
def config(tmp_path: Path, engine: str, models: Any) -> Path:
    assert Path(models.llama).name == "llama.gguf"
    config = write_config(tmp_path, engine, [models.dir])
    write_preset(config, "alpha", f'model = "llama.gguf"\nctx = 2048\nport = {free_port()}\n'
                 "[serve]\non_demand = true\n")
    return config


def chat(max_tokens: int, stream: bool = False) -> dict[str, Any]:
    return {"model": "alpha", "messages": [{"role": "user", "content": "Hello"}],
            "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True, "stream": stream}


def as_key(secret: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {secret}"}


def tokens_of(answer: dict[str, Any]) -> int:
    """The tokens of an answer by the engine's own figures: prompt (cache included) and
    generated."""
    t = answer["timings"]
    return int(t["prompt_n"]) + int(t.get("cache_n", 0)) + int(t["predicted_n"])


def refusal(r: httpx.Response, code: str) -> tuple[str, int]:
    """The message and Retry-After of a 429 ``code`` in OpenAI's shape."""
    assert r.status_code == 429, (r.status_code, r.text)
    error = r.json()["error"]
    assert error["code"] == code, error
    return error["message"], int(r.headers["Retry-After"])


def utc_clock(seconds: float) -> int:
    return int(seconds) % 86400


async def test_requests_per_minute_and_a_key_without_limits(
        running: Any, bus_address: str, keys_file: Path, secrets: dict[str, str]) -> None:
    async with gateway_on(bus_address, keys_file=str(keys_file)) as gw, \
            httpx.AsyncClient(base_url=gw.url, timeout=120) as c:  # type: ignore[attr-defined]
        for _ in range(2):
            assert (await c.post("/v1/chat/completions", json=chat(1),
                                 headers=as_key(secrets["bob"]))).status_code == 200
        r = await c.post("/v1/chat/completions", json=chat(1), headers=as_key(secrets["bob"]))
        message, retry = refusal(r, "rate_limit_exceeded")
        assert r.json()["error"]["type"] == "requests"
        found = re.fullmatch(r"key 'bob': 2 requests per minute, next at "
                             r"(\d\d):(\d\d):(\d\d) UTC", message)
        assert found, message
        assert 1 <= retry <= 60
        h, m, s = (int(x) for x in found.groups())
        # the time named is when Retry-After ends (the clock's second, rounded up)
        drift = (h * 3600 + m * 60 + s - utc_clock(time.time() + retry)) % 86400
        assert drift <= 2 or drift >= 86400 - 2, (message, retry)
        # alice has no limit: never refused, however many, bob still refused meanwhile
        for _ in range(6):
            r = await c.post("/v1/chat/completions", json=chat(1),
                             headers=as_key(secrets["alice"]))
            assert r.status_code == 200, r.text
        r = await c.post("/v1/chat/completions", json=chat(1), headers=as_key(secrets["bob"]))
        assert r.status_code == 429


async def stream_tokens(c: httpx.AsyncClient, secret: str, max_tokens: int) -> int:
    """A streamed chat's tokens, by the figures in its last event (the engine's own)."""
    figures = None
    async with c.stream("POST", "/v1/chat/completions", json=chat(max_tokens, True),
                        headers=as_key(secret)) as r:
        assert r.status_code == 200
        async for data in data_lines(r):
            if data.startswith("{"):
                event = json.loads(data)
                if "timings" in event:
                    figures = event
    assert figures is not None, "no timings in the stream"
    return tokens_of(figures)


async def test_tokens_per_minute_count_the_engines_figures(
        running: Any, bus_address: str, keys_file: Path, secrets: dict[str, str]) -> None:
    async with gateway_on(bus_address, keys_file=str(keys_file)) as gw, \
            httpx.AsyncClient(base_url=gw.url, timeout=120) as c:  # type: ignore[attr-defined]
        spent = await stream_tokens(c, secrets["tok"], 32)   # a stream: past 30 by itself
        assert spent > 32
        window = await until(lambda: asyncio.sleep(0, gw.limits.tokens.get("tok")), 10,
                             "the stream's figures counted")
        assert window.used(time.time()) == spent
        r = await c.post("/v1/chat/completions", json=chat(1), headers=as_key(secrets["tok"]))
        message, retry = refusal(r, "rate_limit_exceeded")
        assert r.json()["error"]["type"] == "tokens"
        assert message.startswith(f"key 'tok': 30 tokens per minute ({spent} used in the last "
                                  "minute), next at "), message
        assert 1 <= retry <= 60


async def test_a_day_budget_reached_names_its_reset(
        running: Any, bus_address: str, keys_file: Path, secrets: dict[str, str]) -> None:
    async with gateway_on(bus_address, keys_file=str(keys_file)) as gw, \
            httpx.AsyncClient(base_url=gw.url, timeout=120) as c:  # type: ignore[attr-defined]
        # two requests admitted under the budget end normally, together past it
        answers = await asyncio.gather(*(c.post("/v1/chat/completions", json=chat(8),
                                                headers=as_key(secrets["day"]))
                                         for _ in range(2)))
        assert [a.status_code for a in answers] == [200, 200]
        assert [a.json()["usage"]["completion_tokens"] for a in answers] == [8, 8]
        spent = sum(tokens_of(a.json()) for a in answers)
        assert spent > 20
        await until(lambda: asyncio.sleep(0, "day" in gw.limits.days
                                          and gw.limits.days["day"].used() == spent),
                    10, "both answers' figures counted")
        r = await c.post("/v1/chat/completions", json=chat(1), headers=as_key(secrets["day"]))
        message, retry = refusal(r, "insufficient_quota")
        now = datetime.now(UTC)
        tomorrow = (now + timedelta(days=1)).strftime("%Y-%m-%d")
        assert message == (f"key 'day': its budget of 20 tokens per day is used ({spent} "
                           f"tokens today); it resets at {tomorrow} 00:00 UTC"), message
        midnight = datetime.strptime(tomorrow, "%Y-%m-%d").replace(tzinfo=UTC)
        assert abs(retry - (midnight - now).total_seconds()) <= 5
        # another key is not held by it
        r = await c.post("/v1/chat/completions", json=chat(1), headers=as_key(secrets["alice"]))
        assert r.status_code == 200


async def test_a_budget_holds_across_a_gateway_restart(
        running: Any, bus_address: str, keys_file: Path, secrets: dict[str, str]) -> None:
    async with gateway_on(bus_address, keys_file=str(keys_file)) as gw, \
            httpx.AsyncClient(base_url=gw.url, timeout=120) as c:  # type: ignore[attr-defined]
        r = await c.post("/v1/chat/completions", json=chat(24), headers=as_key(secrets["day"]))
        assert r.status_code == 200
        spent = tokens_of(r.json())

    async def daemon_has_it() -> bool:   # the stopped gateway's last report taken
        (totals,) = await call(running.client, BUS_NAME, OBJECT_PATH, BUS_NAME + ".Usage",
                               "KeyTotals")
        return bool(totals.get("day") and totals["day"][0] == spent)

    await until(daemon_has_it, 10, "the day's tokens kept by the daemon")
    # a new gateway: its budgets start from the daemon's totals, not from zero
    async with gateway_on(bus_address, keys_file=str(keys_file)) as gw, \
            httpx.AsyncClient(base_url=gw.url, timeout=120) as c:  # type: ignore[attr-defined]
        r = await c.post("/v1/chat/completions", json=chat(1), headers=as_key(secrets["day"]))
        message, _ = refusal(r, "insufficient_quota")
        assert f"({spent} tokens today)" in message, message


async def test_without_the_daemons_totals_budgets_count_from_the_start(
        bus_address: str, caplog: pytest.LogCaptureFixture) -> None:
    """A bus with no lokid on it (the real dbus-daemon): the totals cannot be read; the
    budgets count what this gateway counts, and the log says so once, when a key with a
    budget comes."""
    from dbus_fast.aio import MessageBus

    from lokid.core.serve.keys import Identity, Limits
    from lokid.gateway.limits import Limiter, LimitReached

    bus = await MessageBus(bus_address=bus_address).connect()
    try:
        limiter = Limiter(bus)
        await limiter.start()
        assert limiter.failure, "the totals were read from a bus without lokid"
        assert not caplog.records   # nothing to say while no key has a budget
        limiter.check(Identity("open"))
        assert not caplog.records
        day = Identity("day", limits=Limits(tokens_per_day=20))
        limiter.check(day)
        limiter.spent(day, 25)
        for _ in range(3):
            with pytest.raises(LimitReached) as e:
                limiter.check(day)
            assert "(25 tokens today)" in e.value.message
        said = [r.getMessage() for r in caplog.records]
        assert len(said) == 1 and "count from this gateway's start" in said[0], said
        await limiter.stop()
    finally:
        bus.disconnect()
