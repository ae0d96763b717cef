"""The gate in front of an engine (issue 46, items 3 and 4), through the real gateway, the
real daemon and the real llama-server with ``--parallel 2``, named keys read from a keys
file: a flooding key does not push another key's request behind all of its own; a key's
``max_in_flight``; 429 with ``Retry-After`` past the bounds; a client gone while waiting
frees its place; a batch flood leaves a slot for an interactive key; never more in
flight than the engine's slots (its own ``/slots``); and an engine without ``-np`` is
gated at the slots its ``/props`` says (llama-server b11434's auto: 4)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from support.enginekit import write_config, write_preset
from support.gatewaykit import gateway_on, until

from lokid.core.place.need import DEFAULT_PARALLEL
from lokid.core.serve.keys import digest
from lokid.gateway.server import Gateway

pytestmark = [pytest.mark.engine, pytest.mark.slow]

SLOTS = 2
KEYS = {   # name: (secret, extra fields of its table)
    "flood": ("sk-loki-flood-0000000000000000000000000000000", ""),
    "alice": ("sk-loki-alice-0000000000000000000000000000000", ""),
    "bob": ("sk-loki-bob-000000000000000000000000000000000", ""),
    "one": ("sk-loki-one-000000000000000000000000000000000", "max_in_flight = 1\n"),
    "job": ("sk-loki-job-000000000000000000000000000000000", 'class = "batch"\n'),
}
LONG = 3000   # tokens of an answer that holds its slot while the test looks (seconds)


@pytest.fixture
def config(tmp_path: Path, engine: str, models: Any, ports: dict[str, int]) -> Path:
    config = write_config(tmp_path, engine, [models.dir])
    assert Path(models.llama).name == "llama.gguf"
    write_preset(config, "alpha", f'model = "llama.gguf"\nctx = 8192\nport = {ports["alpha"]}\n'
                 f'extra_args = ["-np", "{SLOTS}"]\n[serve]\non_demand = true\n')
    write_preset(config, "beta", f'model = "llama.gguf"\nctx = 16384\nport = {ports["beta"]}\n'
                 '[serve]\non_demand = true\n')
    return config


@pytest.fixture
def keys_file(tmp_path: Path) -> Path:
    path = tmp_path / "keys.toml"
    path.write_text("".join(f'[keys.{name}]\nhash = "{digest(secret)}"\n{extra}\n'
                            for name, (secret, extra) in KEYS.items()))
    return path


@contextlib.asynccontextmanager
async def team(bus_address: str, keys_file: Path, **settings: Any) -> AsyncIterator[Gateway]:
    async with gateway_on(bus_address, keys_file=str(keys_file), **settings) as gw:
        yield gw


def ask(key: str, tokens: int = LONG, model: str = "alpha") -> dict[str, Any]:
    return {"headers": {"Authorization": f"Bearer {KEYS[key][0]}"},
            "json": {"model": model, "prompt": "Hello", "max_tokens": tokens,
                     "ignore_eos": True, "stream": True}}


class Heads:
    """The order in which answers' heads came back, by key."""

    def __init__(self) -> None:
        self.order: list[str] = []
        self.status: list[int] = []

    async def send(self, c: httpx.AsyncClient, key: str, **kw: Any) -> httpx.Response:
        async with c.stream("POST", "/v1/completions", **ask(key, **kw)) as r:
            self.order.append(key)
            self.status.append(r.status_code)
            await r.aread()
            return r


async def engine_busy(gw: Gateway, preset: str = "alpha") -> int:
    """Slots the engine itself says are processing (its own /slots)."""
    url = gw.presets.presets[preset].url
    async with httpx.AsyncClient(timeout=10) as c:
        slots = (await c.get(url + "/slots")).json()
    return sum(bool(s.get("is_processing")) for s in slots)


async def started(c: httpx.AsyncClient, model: str = "alpha") -> None:
    r = await c.post("/v1/completions", **{**ask("alice", 1, model), "json": {
        "model": model, "prompt": "Hi", "max_tokens": 1}})
    assert r.status_code == 200, r.text


def client(gw: Gateway) -> httpx.AsyncClient:
    return httpx.AsyncClient(base_url=gw.url, timeout=120,  # type: ignore[attr-defined]
                             limits=httpx.Limits(max_connections=None))


async def gone(tasks: list[asyncio.Task[Any]]) -> None:
    """Their clients leave (connections closed mid-answer or while waiting)."""
    for t in tasks:
        t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


def ended(task: asyncio.Task[httpx.Response]) -> str:
    """How a request that should still be waiting or answering ended."""
    if task.exception() is not None:
        return repr(task.exception())
    return f"{task.result().status_code} {task.result().text[:300]}"


async def freed(gw: Gateway, preset: str = "alpha") -> None:
    """Every slot and place given back: none leaked."""
    await until(lambda: _true(gw.admission.share.running(preset) == 0
                              and not gw.admission.waiting()), 30, "every slot freed")


async def test_a_flood_does_not_push_another_key_behind_it_and_slots_hold(
        running: Any, bus_address: str, keys_file: Path) -> None:
    async with team(bus_address, keys_file) as gw, client(gw) as c:
        await started(c)
        heads = Heads()
        most = 0

        async def watch() -> None:
            nonlocal most
            while True:
                most = max(most, await engine_busy(gw))
                await asyncio.sleep(0.05)

        watcher = asyncio.create_task(watch())
        holders = [asyncio.create_task(heads.send(c, "flood")) for _ in range(SLOTS)]
        await until(lambda: _true(gw.admission.share.running("alpha") == SLOTS), 30,
                    "both slots taken")
        flood = [asyncio.create_task(heads.send(c, "flood", tokens=16)) for _ in range(8)]
        await until(lambda: _true(gw.admission.waiting() == {"alpha": 8}), 30, "8 waiting")
        other = asyncio.create_task(heads.send(c, "bob", tokens=16))
        await until(lambda: _true(gw.admission.waiting() == {"alpha": 9}), 30, "bob waiting")
        await asyncio.gather(*holders, *flood, other)
        watcher.cancel()
        assert heads.status == [200] * 11
        # FIFO would answer bob last; fair share admits it at the first slot freed, with
        # at most one other flood request (the other slot) beside it
        assert heads.order.index("bob") <= SLOTS + 1, heads.order
        assert most == SLOTS   # the engine had both slots busy, never more
        await freed(gw)


async def test_max_in_flight_and_the_queue_bounds(
        running: Any, bus_address: str, keys_file: Path) -> None:
    async with team(bus_address, keys_file, max_queue_per_key=3, max_queue=6) as gw, \
            client(gw) as c:
        await started(c)
        ones = [asyncio.create_task(Heads().send(c, "one")) for _ in range(3)]
        await until(lambda: _true(gw.admission.waiting() == {"alpha": 2}), 30, "2 waiting")
        assert gw.admission.share.in_flight["one"] == 1   # a slot free, but its limit
        await until(lambda: _is(engine_busy(gw), 1), 30, "one's request in the engine")
        flood = [asyncio.create_task(Heads().send(c, "flood")) for _ in range(4)]
        await until(lambda: _true(gw.admission.waiting() == {"alpha": 5}), 30, "5 waiting")
        r = await c.post("/v1/completions", **ask("flood"))   # its 4th waiting
        assert r.status_code == 429, r.text
        assert int(r.headers["Retry-After"]) >= 1
        err = r.json()["error"]
        assert err["code"] == "rate_limit_exceeded" and err["type"] == "requests"
        assert "key 'flood' on preset 'alpha'" in err["message"]
        assert "number 4" in err["message"]
        flood.append(asyncio.create_task(Heads().send(c, "bob")))   # the preset's 6th
        await until(lambda: _true(gw.admission.waiting() == {"alpha": 6}), 30, "6 waiting")
        r = await c.post("/v1/completions", **ask("alice"))   # its 7th
        assert r.status_code == 429 and "preset 'alpha' is full" in r.json()["error"]["message"]
        await gone(ones + flood)
        await freed(gw)


async def test_a_client_gone_while_waiting_frees_its_place(
        running: Any, bus_address: str, keys_file: Path) -> None:
    async with team(bus_address, keys_file, max_queue=1) as gw, client(gw) as c:
        await started(c)
        holders = [asyncio.create_task(Heads().send(c, "flood")) for _ in range(SLOTS)]
        await until(lambda: _true(gw.admission.share.running("alpha") == SLOTS), 30,
                    "both slots taken")
        waiting = asyncio.create_task(Heads().send(c, "bob"))
        await until(lambda: _true(gw.admission.waiting() == {"alpha": 1}), 30, "bob waiting")
        assert (await c.post("/v1/completions", **ask("alice"))).status_code == 429
        await gone([waiting])   # its connection closed: the gateway's handler is cancelled
        # at once, not when a slot frees (the holders' answers take seconds): on aiohttp 3.8
        # (Debian 12), which cancels no handler, bob kept his place until his turn came
        await until(lambda: _true(gw.admission.waiting() == {}), 30, "bob's place freed")
        assert not any(h.done() for h in holders), [ended(h) for h in holders if h.done()]
        late = asyncio.create_task(c.post("/v1/completions", **ask("alice", 4)))
        await until(lambda: _true(gw.admission.waiting() == {"alpha": 1} or late.done()), 30,
                    "alice waits")
        assert not late.done(), f"alice's request did not wait: {ended(late)}"
        await gone(holders)   # streams cut mid-answer give their slots back
        assert (await late).status_code == 200
        await freed(gw)


async def test_a_batch_flood_leaves_a_slot_for_an_interactive_key(
        running: Any, bus_address: str, keys_file: Path) -> None:
    async with team(bus_address, keys_file) as gw, client(gw) as c:
        await started(c)   # alice, interactive, was just served: the reserve is hers
        batch = [asyncio.create_task(Heads().send(c, "job")) for _ in range(6)]
        await until(lambda: _true(gw.admission.waiting() == {"alpha": 5}), 30, "5 waiting")
        assert gw.admission.share.running("alpha") == 1
        await until(lambda: _is(engine_busy(gw), 1), 30, "the batch request in the engine")
        r = await c.post("/v1/completions", **ask("alice", 4))   # no batch stream to wait for
        assert r.status_code == 200
        assert gw.admission.waiting() == {"alpha": 5}   # batch still waits: alice went first
        await gone(batch)
        await freed(gw)


async def test_an_engine_without_np_is_gated_at_its_own_slots(
        running: Any, bus_address: str, keys_file: Path) -> None:
    async with team(bus_address, keys_file) as gw, client(gw) as c:
        await started(c, "beta")
        url = gw.presets.presets["beta"].url
        async with httpx.AsyncClient(timeout=10) as e:
            total = (await e.get(url + "/props")).json()["total_slots"]
        assert total == DEFAULT_PARALLEL   # llama-server b11434's -np auto
        await until(lambda: _true("beta" in gw.admission.read), 10, "its /props read")
        assert gw.admission.read["beta"][1] == total
        flood = [asyncio.create_task(Heads().send(c, "flood", model="beta"))
                 for _ in range(total + 2)]
        await until(lambda: _true(gw.admission.waiting() == {"beta": 2}), 30, "2 waiting")
        await until(lambda: _is(engine_busy(gw, "beta"), total), 30, "every slot busy")
        assert gw.admission.waiting() == {"beta": 2}   # none past the slots
        await gone(flood)
        await freed(gw, "beta")


async def _true(value: bool) -> bool:
    return value


async def _is(count: Any, expected: int) -> bool:
    return await count == expected
