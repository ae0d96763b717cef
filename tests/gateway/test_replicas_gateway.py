"""A preset's local replicas through the gateway (issue 47, items 1 and 2): the real
daemon (local runner) on a private bus, the real engines of the tiny model (one slot
each, ``-np 1``), the gateway in the test's loop. Which engine answered is what the
gateway chose (its ``pick``, wrapped to note the URL) and, for the cache, the engine's
own figures (``timings.cache_n``).

- ``r`` runs 2 replicas: a conversation's second turn goes to the engine of its first,
  and reads its first turn from that engine's cache; new conversations spread over
  both; a replica killed mid-stream ends its client's stream with an error event, and
  the next request goes to the other, before lokid has seen the engine's end too (its
  port refuses the connection); an edit's restart rolls through both while a
  client streams, no request failing;
- ``s`` runs 1 and may run 2, each engine on one thread (``-t 1``: two fit the two
  cores the suite runs on): requests waiting longer than a replica's load start
  replica 2, which takes some of them; idle, it is stopped before the preset's own
  idle stop, by a gateway started again meanwhile too; one started by hand is not;
- ``u`` may run 2, each engine on every core (``-t`` = the host's physical cores): the
  same wait starts no replica, and the gateway says why (it would share the CPU)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import signal
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from support.daemonkit import Running
from support.enginekit import free_ports, write_config, write_preset
from support.gatewaykit import gateway_on, until

from lokid.core.names import MANAGER_INTERFACE, OBJECT_PATH
from lokid.core.serve.prefixes import chain
from lokid.core.serve.scaling import NEVER
from lokid.core.serve.scaling import hold as hold_down
from lokid.gateway.groups import swap_cost
from lokid.gateway.peers import HOP_HEADER
from lokid.gateway.replicas import LOOK
from lokid.gateway.server import Gateway
from lokid.host.cores import host_cores
from lokid.runners import local_runner

pytestmark = [pytest.mark.engine, pytest.mark.slow]

HOLD = 30000   # tokens: a stream that holds an engine's only slot until it is cut
OPENING = "You answer questions about a small shop in one short sentence. " * 6


@pytest.fixture
def ports() -> dict[str, int]:
    r, s, u = free_ports(2), free_ports(2), free_ports(2)
    return {"r": r, "s": s, "u": u}


@pytest.fixture
def config(tmp_path: Path, engine: str, models: Any, ports: dict[str, int]) -> Path:
    assert Path(models.llama).name == "llama.gguf"   # written on first use
    assert Path(models.llama_long).name == "llama-long.gguf"
    config = write_config(tmp_path, engine, [models.dir])
    write_preset(config, "r", f'model = "llama.gguf"\nctx = 4096\nport = {ports["r"]}\n'
                 'extra_args = ["-np", "1"]\n[serve]\nreplicas = 2\n')
    write_preset(config, "s", f'model = "llama-long.gguf"\nctx = 32768\nport = {ports["s"]}\n'
                 'extra_args = ["-np", "1", "-t", "1"]\n[serve]\nmax_replicas = 2\n'
                 'idle_stop = "12s"\n')
    write_preset(config, "u", f'model = "llama.gguf"\nctx = 4096\nport = {ports["u"]}\n'
                 f'extra_args = ["-np", "1", "-t", "{host_cores()}"]\n[serve]\n'
                 'max_replicas = 2\n')
    return config


@pytest.fixture
async def gateway(running: Running, bus_address: str) -> AsyncIterator[Gateway]:
    async with gateway_on(bus_address) as g:
        yield g


@contextlib.contextmanager
def noted(gateway: Gateway) -> Iterator[list[str]]:
    """The engine URL the gateway chose for each request, in order."""
    urls: list[str] = []
    pick = gateway.replicas.pick

    @contextlib.contextmanager
    def wrapped(*args: Any) -> Iterator[tuple[int, str]]:
        with pick(*args) as chosen:
            urls.append(chosen[1])
            yield chosen

    gateway.replicas.pick = wrapped  # type: ignore[method-assign,assignment]
    try:
        yield urls
    finally:
        gateway.replicas.pick = pick  # type: ignore[method-assign]


@contextlib.asynccontextmanager
async def slot_held(c: httpx.AsyncClient, body: dict[str, Any]) -> AsyncIterator[None]:
    """A stream holding the only slot of a preset's engine while the block runs (cut at
    its end): the requests sent meanwhile wait at the gate, whatever the machine's speed."""
    started = asyncio.Event()

    async def hold() -> None:
        async with c.stream("POST", "/v1/chat/completions", json={
                **body, "stream": True, "max_tokens": HOLD, "ignore_eos": True}) as r:
            async for _ in r.aiter_lines():
                started.set()
    holder = asyncio.get_running_loop().create_task(hold())
    try:
        await asyncio.wait_for(started.wait(), 60)
        yield
    finally:
        holder.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await holder


def chat(who: str, turn: int, **more: Any) -> dict[str, Any]:
    # each conversation its own opening (a system prompt shared by all is the affinity
    # rule's business, lokid.core.serve.affinity; here: which engine of the preset, and back)
    messages: list[dict[str, Any]] = []
    for k in range(1, turn + 1):
        messages.append({"role": "user", "content": f"{who}: {OPENING if k == 1 else ''}"
                         f"question number {k}?"})
        if k < turn:
            messages.append({"role": "assistant", "content": f"{who}: answer {k}."})
    return {"model": "r", "messages": messages, "max_tokens": 4, "temperature": 0, **more}


async def engines_ready(gateway: Gateway, name: str, want: dict[int, str]) -> dict[int, Any]:
    async def seen() -> dict[int, Any] | None:
        got = {e.index: e for e in gateway.presets.presets[name].engines}
        return got if all(k in got and got[k].state == s for k, s in want.items()) else None
    found: dict[int, Any] = await until(seen, 120, f"{name}'s engines {want}")
    return found


def engine_pid(running: Running, instance: str) -> int:
    runner = running.daemon.runner
    assert isinstance(runner, local_runner.LocalRunner)
    proc = runner.engines[instance].proc
    assert proc is not None
    with open(f"/proc/{proc.pid}/task/{proc.pid}/children") as f:
        (pid,) = (int(p) for p in f.read().split())
    return pid


async def test_conversations_stay_on_their_replica_and_a_killed_one_is_passed_over(
        running: Running, gateway: Gateway, ports: dict[str, int],
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(local_runner, "RESTART_SEC", 30)   # the killed one stays down
    manager = await running.iface(OBJECT_PATH, MANAGER_INTERFACE)
    await manager.call_start_preset("r")
    engines = await engines_ready(gateway, "r", {1: "ready", 2: "ready"})
    one, two = gateway.presets.presets["r"].url, engines[2].url
    assert two == f"http://127.0.0.1:{ports['r'] + 1}"
    # replica 2's memory is the placement's too (the daemon's Memory says what it holds):
    # counted nowhere, the room it took looked free to another preset's start
    preset = gateway.presets.presets["r"]

    async def held() -> Any:
        return preset.memory.get("replicas_held", {}).get("2")
    assert (await until(held, 30, "replica 2's memory in r's Memory")) == \
        preset.memory["needs"]
    replica = [r for r in gateway.placer.residents(0.0) if r.preset == "r:2"]
    assert [(dict(r.held), r.keep) for r in replica] == [(preset.memory["needs"], True)]
    firsts: dict[str, str] = {}
    async with httpx.AsyncClient(base_url=gateway.url, timeout=60) as c:  # type: ignore[attr-defined]
        with noted(gateway) as urls:
            for who in "abcdef":
                r1 = await c.post("/v1/chat/completions", json=chat(who, 1))
                assert r1.status_code == 200, r1.text
                r2 = await c.post("/v1/chat/completions", json=chat(who, 2))
                assert r2.status_code == 200, r2.text
                # its second turn on the engine of its first, which read turn 1 from cache
                assert urls[-1] == urls[-2], (who, urls)
                t1, t2 = r1.json()["timings"], r2.json()["timings"]
                assert t2["cache_n"] >= t1["prompt_n"] + t1["cache_n"] - 1, (who, t1, t2)
                # the model of its answers is the preset's, whichever engine answered
                # (replica 2's said "r:2": its --alias was its instance's name)
                assert r1.json()["model"] == r2.json()["model"] == "r", (urls[-1], r1.text)
                firsts[who] = urls[-1]
        # new conversations spread over both engines (by their hash)
        assert set(firsts.values()) == {one, two}, firsts
        # /v1/models shows its engines as such, never their addresses
        listed = (await c.get("/v1/models/r")).json()["lokid"]
        assert [(e["index"], e["state"]) for e in listed["engines"]] == [
            (1, "ready"), (2, "ready")] and str(ports["r"] + 1) not in json.dumps(listed)
        # a peer is told what every engine holds: the conversations on replica 2 too
        told = (await c.get("/v1/models/r", headers={HOP_HEADER: "1"})).json()["lokid"]
        for who, url in firsts.items():
            last = chain("r", {"messages": chat(who, 2)["messages"]}).prints[-1]
            assert f"{last:016x}" in told["prefixes"], (who, url == two)

        # a conversation on replica 2, its engine killed mid-stream: the error event. Its
        # step (`lokid engine r:2`, the engine's parent) is held still first, so that lokid
        # cannot see the engine's end: the gap in which the gateway still counts it ready
        who = next(w for w, u in firsts.items() if u == two)
        runner = running.daemon.runner
        assert isinstance(runner, local_runner.LocalRunner)
        step = runner.engines["r:2"].proc.pid  # type: ignore[union-attr]
        text, killed = b"", False
        with noted(gateway) as urls:
            try:
                async with c.stream("POST", "/v1/chat/completions", json=chat(
                        who, 3, stream=True, max_tokens=3000, ignore_eos=True)) as s:
                    async for chunk in s.aiter_raw():
                        text += chunk
                        if not killed and text.count(b"data: ") >= 5:
                            pid = engine_pid(running, "r:2")
                            os.kill(step, signal.SIGSTOP)
                            os.kill(pid, signal.SIGKILL)
                            killed = True
                assert urls == [two]
                events = [line[6:] for line in text.decode().splitlines()
                          if line.startswith("data: ")]
                assert "error" in json.loads(events[-1]), events[-3:]
                # the next turn, streamed, before lokid knows: replica 2's port refuses
                # it, and replica 1 answers it (it was answered 502 before)
                assert gateway.replicas.several(gateway.presets.presets["r"])
                async with c.stream("POST", "/v1/chat/completions",
                                    json=chat(who, 3, stream=True)) as s:
                    assert s.status_code == 200
                    body = await s.aread()
                assert b"data: [DONE]" in body and b'"error"' not in body, body[-300:]
                assert urls == [two, two, one]
                assert ("r", 2) in gateway.replicas.down
            finally:
                os.kill(step, signal.SIGCONT)
            # once lokid says replica 2 is down, requests go to replica 1 at once
            await until(lambda: _true(not gateway.replicas.several(
                gateway.presets.presets["r"])), 30, "replica 2 not ready")
            again = await c.post("/v1/chat/completions", json=chat(who, 4))
            assert again.status_code == 200, again.text
            assert urls == [two, two, one, one]
    await manager.call_stop_preset("r")
    await running.wait_event("r", "inactive")


async def test_waiting_requests_start_replica_2_and_idleness_stops_it(
        running: Running, bus_address: str) -> None:
    manager = await running.iface(OBJECT_PATH, MANAGER_INTERFACE)
    await manager.call_start_preset("s")
    body = {"model": "s", "messages": [{"role": "user", "content": "Count."}],
            "max_tokens": 8, "temperature": 0}
    async with gateway_on(bus_address) as gateway, \
            httpx.AsyncClient(base_url=gateway.url, timeout=120) as c:  # type: ignore[attr-defined]
        await engines_ready(gateway, "s", {1: "ready"})
        preset = gateway.presets.presets["s"]
        assert (preset.max_replicas, preset.idle_stop, len(preset.engines)) == (2, 12.0, 1)
        async with slot_held(c, body):   # longer than a replica's load
            with noted(gateway) as urls:
                answers = await asyncio.gather(*(c.post("/v1/chat/completions", json=body)
                                                 for _ in range(2)))
                assert [a.status_code for a in answers] == [200] * 2
            engines = {e.index: e for e in preset.engines}
            # replica 2 started for them (its row says so), and answered them
            assert urls == [engines[2].url] * 2, (urls, engines)
            assert gateway.scaler.started["s"] == {2} and engines[2].for_load
    # the gateway stopped before replica 2 was idle long enough; one started again takes
    # it back from its row's for_load (it had forgotten it: it ran until the preset's stop)
    async with gateway_on(bus_address) as gateway, \
            httpx.AsyncClient(base_url=gateway.url, timeout=120) as c:  # type: ignore[attr-defined]
        await engines_ready(gateway, "s", {1: "ready", 2: "ready"})
        preset = gateway.presets.presets["s"]
        # idle: replica 2 stops (idle_stop / 4 = 3 s), the preset's own engine runs on
        await engines_ready(gateway, "s", {1: "ready", 2: "inactive"})
        assert preset.state == "ready" and gateway.scaler.started["s"] == set()
        # and it takes requests as before, on its own engine
        with noted(gateway) as urls:
            r = await c.post("/v1/chat/completions", json=body)
            assert r.status_code == 200 and urls == [preset.url]
        # one started by hand (lokictl replica start) is never the rule's to stop
        assert await manager.call_start_replica("s") == 2
        engines = await engines_ready(gateway, "s", {1: "ready", 2: "ready"})
        assert not engines[2].for_load
        # past idle_stop / 4 (3 s) since it was ready, the rule's hold-down since its
        # last step, and two of its looks: when it would have stopped one of its own
        wait = max(3.0, hold_down(swap_cost(preset)[0]) - (time.monotonic() - gateway.scaler
                                                      .changed_at.get("s", NEVER)))
        await asyncio.sleep(wait + 2 * LOOK + 0.5)
        assert {e.index: e.state for e in preset.engines} == {1: "ready", 2: "ready"}
        assert gateway.scaler.started["s"] == set()
    await manager.call_stop_preset("s")
    await running.wait_event("s", "inactive")


async def test_a_replica_that_would_share_the_cpu_is_not_started(
        running: Running, bus_address: str, caplog: pytest.LogCaptureFixture) -> None:
    # on 2 CPUs three engines of default threads answered 212 requests where one answered
    # 2,725 (benchmarks/replicas_rising.py): a replica on its siblings' cores slows them
    manager = await running.iface(OBJECT_PATH, MANAGER_INTERFACE)
    await manager.call_start_preset("u")
    body = {"model": "u", "messages": [{"role": "user", "content": "Count."}],
            "max_tokens": 8, "temperature": 0}
    with caplog.at_level(logging.INFO, "lokid.gateway"):
        async with gateway_on(bus_address) as gateway, \
                httpx.AsyncClient(base_url=gateway.url, timeout=120) as c:  # type: ignore[attr-defined]
            await engines_ready(gateway, "u", {1: "ready"})
            preset = gateway.presets.presets["u"]
            async with slot_held(c, body):
                waiting = asyncio.get_running_loop().create_task(
                    c.post("/v1/chat/completions", json=body))

                async def refused() -> bool | None:
                    return any("would share the CPU" in r.getMessage() and "preset u"
                               in r.getMessage() for r in caplog.records) or None
                await until(refused, 60, "the rule's refusal of a replica on shared cores")
                # past a replica's load and the rule's looks: still one engine
                await asyncio.sleep(swap_cost(preset)[0] + 2 * LOOK)
                assert [e.index for e in preset.engines if e.state != "inactive"] == [1]
                assert gateway.scaler.started.get("u", set()) == set()
            assert (await waiting).status_code == 200
    said = [r.getMessage() for r in caplog.records if "would share the CPU" in r.getMessage()]
    assert len(said) == 1, said   # once per reason, not at every look
    cores = host_cores()
    assert f"1 running engine of {cores} thread{'s' if cores > 1 else ''} each (its -t)" \
        in said[0]
    await manager.call_stop_preset("u")
    await running.wait_event("u", "inactive")


async def test_an_edit_rolls_through_the_replicas_while_a_client_streams(
        running: Running, gateway: Gateway, config: Path) -> None:
    manager = await running.iface(OBJECT_PATH, MANAGER_INTERFACE)
    await manager.call_start_preset("r")
    before = await engines_ready(gateway, "r", {1: "ready", 2: "ready"})
    preset = gateway.presets.presets["r"]
    # the edit: a smaller context, applied by a restart (lokictl restart, Cockpit's button)
    path = config / "presets" / "r.toml"
    path.write_text(path.read_text().replace("ctx = 4096", "ctx = 3072"))
    await manager.call_reload()
    answers: list[tuple[int, str]] = []
    done = asyncio.Event()

    async def client(c: httpx.AsyncClient, who: str) -> None:
        turn = 0
        while not done.is_set():
            turn += 1
            async with c.stream("POST", "/v1/chat/completions", json=chat(
                    who, 1, stream=True, max_tokens=24)) as s:
                answers.append((s.status_code, (await s.aread()).decode()))

    async with httpx.AsyncClient(base_url=gateway.url, timeout=60) as c:  # type: ignore[attr-defined]
        clients = [asyncio.get_running_loop().create_task(client(c, w)) for w in "xy"]
        try:
            await until(lambda: _true(len(answers) >= 2), 60, "the clients streaming")
            await manager.call_restart_preset("r")

            async def rolled() -> bool:
                now = {e.index: e for e in preset.engines}
                return all(k in now and now[k].state == "ready" and
                           now[k].ready_at > before[k].ready_at for k in (1, 2)) \
                    and "3072" in preset.running_argv
            await until(rolled, 120, "both engines restarted with the edit")
            seen = len(answers)
            await until(lambda: _true(len(answers) >= seen + 2), 60, "answers after the roll")
        finally:
            done.set()
            await asyncio.gather(*clients)
    failed = [(status, text[-300:]) for status, text in answers
              if status != 200 or '"error"' in text or "data: [DONE]" not in text]
    assert not failed, failed
    await manager.call_stop_preset("r")
    await running.wait_event("r", "inactive")


async def _true(value: bool) -> bool:
    return value
