"""Cache-affine routing across two peer gateways (issue 47, item 2): two lokid hosts, each
its own private bus (the real dbus-daemon), daemon (local runner), gateway and real
llama-server with one slot (``-np 1``) for the preset ``shared``, the gateways peered
with each other. Which engine answered, and how much of the prompt it took from its
cache, are read from the engine's own figures (``timings.cache_n`` in its answer) and
from each gateway's request counts.

The story: conversations Y and Z start on B (asked there directly); Y's second turn,
asked at A, goes to B (B's listing told A what B's engine holds), and B's engine reads
the system prompt and the first turn from its cache. While B's only slot is held by Y's
third turn, Z's second turn, asked at A, does not queue behind it (B is full): A's own
engine answers it (a spill), and Z's third turn follows it there, to A's cache."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from support.daemonkit import daemon_on, private_bus
from support.enginekit import free_port, write_config, write_preset
from support.gatewaykit import gateway_on, until

from lokid.core.fleet.peers import Peer
from lokid.core.fleet.route import LOCAL
from lokid.core.serve.prefixes import chain
from lokid.gateway import peers as peers_mod
from lokid.gateway.report import PRESET_KEY
from lokid.gateway.server import Gateway

pytestmark = [pytest.mark.engine, pytest.mark.slow]

PEER_KEY = "peer-key-47"
# ~1,000 byte tokens (the test model's tokenizer): what a cache hit saves, and what
# cache_n must cover to count as one
SYSTEM = "You are the assistant of a small shop. Answer in one short sentence. " * 15
HOLD = 30000   # tokens: Y's third turn holds B's only slot until it is cut


def messages(who: str, turn: int) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = [{"role": "system", "content": SYSTEM}]
    for k in range(1, turn + 1):
        out.append({"role": "user", "content": f"{who}: question number {k}?"})
        if k < turn:
            out.append({"role": "assistant", "content": f"{who}: answer number {k}."})
    return out


def chat(who: str, turn: int, **more: Any) -> dict[str, Any]:
    return {"model": "shared", "messages": messages(who, turn), "max_tokens": 4,
            "temperature": 0, **more}


class Host:
    def __init__(self, name: str, root: Path):
        self.name, self.root = name, root
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.answered: list[str] = []   # presets its gateway's engine answered
        self.gateway: Gateway | None = None


@pytest.fixture
async def pair(tmp_path: Path, engine: str, models: Any,
               monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[dict[str, Host]]:
    monkeypatch.setattr(peers_mod, "POLL_EVERY", 0.3)   # the test waits less; same rule
    assert Path(models.llama_long).name == "llama-long.gguf"   # made on first use
    hosts = {h: Host(h, tmp_path / h) for h in "ab"}
    async with contextlib.AsyncExitStack() as stack:
        for host in hosts.values():
            host.root.mkdir()
            key = host.root / "peer.key"
            key.write_text(PEER_KEY + "\n")
            config = write_config(host.root, engine, [models.dir])
            write_preset(config, "shared", f'model = "llama-long.gguf"\nctx = 32768\n'
                         f'port = {free_port()}\nextra_args = ["-np", "1"]\n'
                         '[serve]\non_demand = true\n')
            address = stack.enter_context(private_bus(host.root))
            await stack.enter_async_context(daemon_on(config, host.root, address))
            other = hosts["b" if host.name == "a" else "a"]
            gateway: Gateway = await stack.enter_async_context(gateway_on(
                address, port=host.port, keys=frozenset({f"client-{host.name}", PEER_KEY}),
                peers=(Peer(other.name, other.url, str(key)),)))
            host.gateway = gateway
            original = gateway.report.count

            def count(request: Any, status: int, host: Host = host,
                      original: Any = original) -> None:
                if request.get(PRESET_KEY):   # the cut stream too, whatever its status
                    host.answered.append(str(request[PRESET_KEY]))
                original(request, status)

            gateway.report.count = count  # type: ignore[method-assign]
        yield hosts


async def ask(c: httpx.AsyncClient, host: Host, body: dict[str, Any]) -> dict[str, Any]:
    r = await c.post(host.url + "/v1/chat/completions", json=body,
                     headers={"Authorization": f"Bearer client-{host.name}"})
    assert r.status_code == 200, r.text
    timings: dict[str, Any] = r.json()["timings"]
    assert isinstance(timings["cache_n"], int) and isinstance(timings["prompt_n"], int)
    return timings


async def test_a_conversation_returns_to_the_engine_holding_it_unless_that_one_is_full(
        pair: dict[str, Host]) -> None:
    a, b = pair["a"], pair["b"]
    assert a.gateway is not None and b.gateway is not None
    affinity = a.gateway.peers.affinity
    async with httpx.AsyncClient(timeout=120) as c:
        # A's own engine started and warm, with a prompt of its own
        await ask(c, a, {"model": "shared", "max_tokens": 1,
                         "messages": [{"role": "user", "content": "warm"}]})
        # Y's and Z's first turns on B, asked there: B's engine holds them
        await ask(c, b, chat("z", 1))
        y1 = await ask(c, b, chat("y", 1))
        assert b.answered == ["shared"] * 2 and a.answered == ["shared"]
        prompt_y1 = y1["prompt_n"] + y1["cache_n"]
        assert prompt_y1 > len(SYSTEM)   # every byte a token, and the template
        # B's listing tells A (the hop mark) where their prefixes live: B, ready, one slot
        last = chain("shared", {"messages": messages("y", 1)}).prints[-1]
        last_z = chain("shared", {"messages": messages("z", 1)}).prints[-1]

        async def learned() -> bool:   # and that Y's first turn has left B's slot
            assert a.gateway is not None
            seen = a.gateway.peers.states["b"].models.get("shared")
            return affinity.table.get(last) == affinity.table.get(last_z) == (
                "shared", "b") and seen is not None and seen.in_flight == 0 \
                and seen.slots == 1
        await until(learned, 20, "A told by B's listing what B's engine holds")
        # Y's second turn asked at A goes to B, where the engine reads it from cache
        y2 = await ask(c, a, chat("y", 2))
        assert b.answered == ["shared"] * 3 and a.answered == ["shared"], (a.answered,
                                                                          b.answered)
        assert y2["cache_n"] >= prompt_y1 - 1, (y1, y2)   # all but the last token of turn 1
        # a client's listing shows no fingerprint of any prompt
        listed = await c.get(a.url + "/v1/models", headers={
            "Authorization": "Bearer client-a"})
        assert "prefixes" not in listed.text and f"{last:016x}" not in listed.text
        assert f"{last:016x}" not in json.dumps(a.gateway.peers.listing())

        # Y's third turn, through A, holds B's only slot (once A has read B's slot free:
        # B's listing says its requests in flight as its daemon last counted them)
        await until(learned, 20, "B's slot free again in its listing")

        async def hold() -> None:
            async with c.stream("POST", a.url + "/v1/chat/completions", json=chat(
                    "y", 3, stream=True, max_tokens=HOLD, ignore_eos=True),
                    headers={"Authorization": "Bearer client-a"}) as r:
                assert r.status_code == 200
                async for _ in r.aiter_lines():
                    pass
        holder = asyncio.get_running_loop().create_task(hold())
        try:
            await until(lambda: _true(a.gateway is not None and
                                      a.gateway.peers.states["b"].sent["shared"] == 1),
                        30, "Y's third turn in B's only slot")
            # Z's second turn: B holds Z, but B is full while A's engine idles: A
            # answers, reading Z's history (A's engine had never seen this system prompt)
            z2 = await ask(c, a, chat("z", 2))
            assert a.answered == ["shared"] * 2, (a.answered, b.answered)
            assert z2["cache_n"] < len(SYSTEM), z2
            assert affinity.table[chain("shared", {"messages": messages("z", 2)}).prints[-1]
                                  ] == ("shared", LOCAL)
        finally:
            holder.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await holder
        # Z's third turn follows it to A's engine, and to its cache, B free again
        z3 = await ask(c, a, chat("z", 3))
        assert a.answered == ["shared"] * 3 and b.answered == ["shared"] * 4
        assert z3["cache_n"] >= z2["prompt_n"] + z2["cache_n"] - 1, (z2, z3)


async def _true(value: bool) -> bool:
    return value
