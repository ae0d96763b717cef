"""Who waits, where and why is visible (issue 46, item 4), through the real gateway, the
real daemon and the real llama-server with ``-np 1``, named keys read from a keys file:
while one key's stream holds the only slot, the other keys' requests waiting at the gate
are shown by ``lokictl top --json`` and ``lokictl top --once`` (from the daemon's
``org.lokid.Lokid1.Usage.Queues``, which the gateway's :mod:`lokid.gateway.waiting`
reports), per key and class with the why; once they are served, nothing is."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest
from support.enginekit import write_config, write_preset
from support.gatewaykit import gateway_on, until

from lokid.core.serve.keys import digest

pytestmark = [pytest.mark.engine, pytest.mark.slow]

KEYS = {   # name: (secret, extra fields of its table)
    "alice": ("sk-loki-alice-0000000000000000000000000000000", ""),
    "bob": ("sk-loki-bob-000000000000000000000000000000000", ""),
    "job": ("sk-loki-job-000000000000000000000000000000000", 'class = "batch"\n'),
}
LONG = 8000   # tokens: the holder's stream holds the only slot until it is cut


@pytest.fixture
def config(tmp_path: Path, engine: str, models: Any, ports: dict[str, int]) -> Path:
    config = write_config(tmp_path, engine, [models.dir])
    assert Path(models.llama).name == "llama.gguf"   # made on first use
    write_preset(config, "alpha", f'model = "llama.gguf"\nctx = 8192\nport = {ports["alpha"]}\n'
                 'extra_args = ["-np", "1"]\n[serve]\non_demand = true\n')
    return config


@pytest.fixture
def keys_file(tmp_path: Path) -> Path:
    path = tmp_path / "keys.toml"
    path.write_text("".join(f'[keys.{name}]\nhash = "{digest(secret)}"\n{extra}\n'
                            for name, (secret, extra) in KEYS.items()))
    return path


def ask(key: str, tokens: int) -> dict[str, Any]:
    return {"headers": {"Authorization": f"Bearer {KEYS[key][0]}"},
            "json": {"model": "alpha", "prompt": "Hello", "max_tokens": tokens,
                     "ignore_eos": True, "stream": True}}


async def send(c: httpx.AsyncClient, key: str, tokens: int) -> int:
    async with c.stream("POST", "/v1/completions", **ask(key, tokens)) as r:
        await r.aread()
        return r.status_code


def lokictl(address: str, *args: str) -> str:
    r = subprocess.run([sys.executable, "-m", "lokid.ctl", "--address", address, *args],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r
    return r.stdout


async def queue_of(address: str) -> list[dict[str, Any]]:
    rows = json.loads(await asyncio.to_thread(lokictl, address, "top", "--json"))
    alpha = next(r for r in rows if r["preset"] == "alpha")
    return list(alpha.get("queue") or [])


async def test_waiting_requests_are_shown_per_key_and_class_then_gone(
        running: Any, bus_address: str, keys_file: Path) -> None:
    async with gateway_on(bus_address, keys_file=str(keys_file)) as gw, \
            httpx.AsyncClient(base_url=gw.url, timeout=120,  # type: ignore[attr-defined]
                              limits=httpx.Limits(max_connections=None)) as c, \
            httpx.AsyncClient(base_url=gw.url, timeout=120,  # type: ignore[attr-defined]
                              ) as holder_client:
        r = await c.post("/v1/completions", **ask("alice", 1))
        assert r.status_code == 200, r.text   # started, warm
        holder = asyncio.create_task(send(holder_client, "alice", LONG))
        await until(lambda: _true(gw.admission.share.running("alpha") == 1), 30,
                    "alice's stream in the only slot")
        waiters = [asyncio.create_task(send(c, "bob", 4)) for _ in range(2)] + \
            [asyncio.create_task(send(c, "job", 4))]
        await until(lambda: _true(gw.admission.waiting() == {"alpha": 3}), 30, "3 waiting")

        async def shown() -> list[dict[str, Any]]:
            q = await queue_of(bus_address)
            return q if sum(r["waiting"] for r in q) == 3 else []

        queue = await until(shown, 30, "the 3 waiting requests in lokictl top --json")
        by_key = {r["key"]: r for r in queue}
        assert set(by_key) == {"bob", "job"}, queue
        assert by_key["bob"]["waiting"] == 2 and by_key["bob"]["class"] == "interactive"
        assert by_key["job"]["waiting"] == 1 and by_key["job"]["class"] == "batch"
        assert by_key["bob"]["why"] == "slots busy (1/1)", queue
        assert by_key["job"]["why"] == "slots busy (1/1)", queue
        assert all(r["oldest_s"] >= 0 for r in queue)
        again = {r["key"]: r for r in await queue_of(bus_address)}
        assert again["bob"]["oldest_s"] >= by_key["bob"]["oldest_s"]   # aged by the daemon

        text = await asyncio.to_thread(lokictl, bus_address, "top", "--once")
        assert "waiting requests:" in text, text
        line = next(x for x in text.splitlines() if x.split()[:2] == ["alpha", "bob"])
        assert line.split()[2:4] == ["interactive", "2"] and "slots busy (1/1)" in line, text

        holder.cancel()   # its client gone: the slot goes to the waiting ones
        await asyncio.gather(holder, return_exceptions=True)
        assert await asyncio.gather(*waiters) == [200, 200, 200]
        await until(lambda: _true(not gw.admission.waiting()), 30, "nothing waiting")

        async def empty() -> bool:
            return not await queue_of(bus_address)

        await until(empty, 30, "no queue left in lokictl top --json")
        text = await asyncio.to_thread(lokictl, bus_address, "top", "--once")
        assert "waiting requests:" not in text, text


async def _true(value: bool) -> bool:
    return value
