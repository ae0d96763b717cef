"""Peer gateways (issue 30, item 1): three lokid hosts in one test, each its own private
bus (the real dbus-daemon), daemon (local runner), real engines and gateway, the three
gateways peered with each other by ``[gateway] peers``, each with client keys of its own
and the one key the peers present.

Host A serves ``alpha``; B serves ``beta`` and ``shared``; C serves ``shared`` (all on
demand). A client asks A only, with A's key: what another host answers was relayed there
with the peer key (B and C refuse A's client key, so a forwarded client key would be a
401), and which host answered is read from each gateway's own request counts."""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from support.daemonkit import Running, daemon_on, private_bus
from support.enginekit import free_port, write_config, write_preset
from support.gatewaykit import gateway_on, until
from support.sse import data_lines

from lokid.core.fleet.peers import Peer
from lokid.core.names import MANAGER_INTERFACE, OBJECT_PATH
from lokid.gateway import peers as peers_mod
from lokid.gateway import tunnel
from lokid.gateway.peers import HOP_HEADER
from lokid.gateway.report import PRESET_KEY
from lokid.gateway.server import Gateway

pytestmark = [pytest.mark.engine, pytest.mark.slow]

PEER_KEY = "peer-key-5c1e"
SERVES = {"a": ("alpha",), "b": ("beta", "shared"), "c": ("shared",)}


def chat(model: str, **more: Any) -> dict[str, Any]:
    return {"model": model, "messages": [{"role": "user", "content": "Hello"}],
            "max_tokens": 4, "temperature": 0, **more}


class Host:
    """One lokid host: its bus, daemon and gateway (stopped and started again at will),
    and the presets its gateway answered itself, in order."""

    def __init__(self, name: str, root: Path, port: int):
        self.name, self.root, self.port = name, root, port
        self.url = f"http://127.0.0.1:{port}"
        self.answered: list[tuple[str, int]] = []
        self.running: Running | None = None
        self.gateway: Gateway | None = None
        self.stack = contextlib.AsyncExitStack()
        self.settings: dict[str, Any] = {}
        self.address = ""   # its bus

    async def start_gateway(self) -> None:
        self.gateway = await self.stack.enter_async_context(gateway_on(self.address,
                                                                       **dict(self.settings)))
        original = self.gateway.report.count

        def count(request: Any, status: int) -> None:
            if request.get(PRESET_KEY):
                self.answered.append((str(request[PRESET_KEY]), status))
            original(request, status)

        self.gateway.report.count = count  # type: ignore[method-assign]

    async def stop_gateway(self) -> None:
        await self.stack.aclose()
        self.stack = contextlib.AsyncExitStack()
        self.gateway = None


@pytest.fixture
async def fleet(tmp_path: Path, engine: str, models: Any,
                monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[dict[str, Host]]:
    monkeypatch.setattr(peers_mod, "POLL_EVERY", 0.5)   # the tests wait less; same rule
    assert Path(models.llama).name == "llama.gguf"   # generated on first use
    hosts = {h: Host(h, tmp_path / h, free_port()) for h in SERVES}
    async with contextlib.AsyncExitStack() as stack:
        for h, host in hosts.items():
            host.root.mkdir()
            keys = host.root / "peer.key"
            keys.write_text(PEER_KEY + "\n")
            config = write_config(host.root, engine, [models.dir])
            for name in SERVES[h]:
                write_preset(config, name, f'model = "llama.gguf"\nctx = 1024\n'
                             f'port = {free_port()}\n[serve]\non_demand = true\n')
            host.address = stack.enter_context(private_bus(host.root))
            host.running = await stack.enter_async_context(
                daemon_on(config, host.root, host.address))
            host.settings = dict(
                port=host.port, keys=frozenset({f"client-key-{h}", PEER_KEY}),
                peers=tuple(Peer(o.name, o.url, str(keys)) for o in hosts.values()
                            if o is not host))
        for host in hosts.values():
            await host.start_gateway()
        try:
            yield hosts
        finally:
            for host in hosts.values():
                await host.stop_gateway()


def client(key: str = "client-key-a") -> httpx.AsyncClient:
    return httpx.AsyncClient(headers={"Authorization": f"Bearer {key}"}, timeout=120)


async def listed(host: Host, key: str = "client-key-a", **headers: str) -> dict[str, Any]:
    async with client(key) as c:
        r = await c.get(host.url + "/v1/models", headers=headers)
    assert r.status_code == 200, r.text
    return {m["id"]: m for m in r.json()["data"]}


async def all_up(host: Host) -> bool:
    assert host.gateway is not None
    return all(not why for why in host.gateway.peers.summary().values())


async def test_every_gateway_lists_every_model_with_its_replicas(fleet: dict[str, Host]) -> None:
    for h, host in fleet.items():
        await until(lambda host=host: all_up(host), 20, f"{h}'s peers read")
        key = f"client-key-{h}"
        models = await listed(host, key)
        assert sorted(models) == ["alpha", "beta", "shared"], (h, models)
        # a name on B and C is one model, its replicas per host
        shared = models["shared"]["lokid"]
        assert set(shared["replicas"]) == {"b", "c"} - {h}, (h, shared)
        for facts in shared["replicas"].values():
            assert facts["state"] == "inactive" and facts["on_demand"] is True
    # a peer asking (the hop mark) is shown this host's presets only: nothing counted twice
    assert sorted(await listed(fleet["b"], PEER_KEY, **{HOP_HEADER: "1"})) == ["beta", "shared"]
    # no address of a peer reaches a client
    text = json.dumps(await listed(fleet["a"]))
    assert "127.0.0.1" not in text and str(fleet["b"].port) not in text


async def test_a_request_is_answered_by_the_host_that_serves_it(fleet: dict[str, Host]) -> None:
    a, b = fleet["a"], fleet["b"]
    await until(lambda: all_up(a), 20, "A's peers read")
    async with client() as c:
        r = await c.post(a.url + "/v1/chat/completions", json=chat("beta"))
        assert r.status_code == 200, r.text
        assert r.json()["choices"][0]["message"]["content"] is not None
        assert ("beta", 200) in b.answered and not a.answered
        # B's key is not A's: the client's key is refused there, the peer key was sent
        direct = await c.post(b.url + "/v1/chat/completions", json=chat("beta"))
        assert direct.status_code == 401
        # A's own preset stays here
        r = await c.post(a.url + "/v1/chat/completions", json=chat("alpha"))
        assert r.status_code == 200 and ("alpha", 200) in a.answered


async def test_a_stream_through_two_gateways_ends_in_full(
        fleet: dict[str, Host], monkeypatch: pytest.MonkeyPatch) -> None:
    a, b = fleet["a"], fleet["b"]
    await until(lambda: all_up(a), 20, "A's peers read")
    carried: list[int] = []   # the ports each stream was carried to as bytes
    real = tunnel.carry

    async def spy(request: Any, host: str, port: int, *args: Any, **kwargs: Any) -> Any:
        carried.append(port)
        return await real(request, host, port, *args, **kwargs)
    monkeypatch.setattr(tunnel, "carry", spy)
    events = []
    async with client() as c, c.stream("POST", a.url + "/v1/chat/completions",
                                       json=chat("beta", stream=True, max_tokens=12)) as r:
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/event-stream")
        async for data in data_lines(r):
            events.append(data)
    assert events[-1] == "[DONE]", events[-3:]
    chunks = [json.loads(e) for e in events[:-1]]
    assert not any("error" in e for e in chunks), chunks
    assert any(e["choices"] and e["choices"][0].get("finish_reason") for e in chunks)
    assert ("beta", 200) in b.answered
    # through the tunnel both times: A to B's gateway, B to its engine
    assert len(carried) == 2 and carried[0] == int(b.url.rsplit(":", 1)[1]), carried


async def test_a_replica_answers_when_a_host_is_gone_and_a_preset_only_there_is_503(
        fleet: dict[str, Host]) -> None:
    a, b, c_host = fleet["a"], fleet["b"], fleet["c"]
    await until(lambda: all_up(a), 20, "A's peers read")
    await b.stop_gateway()
    async with client() as c:
        # shared: B first by the peers' order, gone: C answers
        r = await c.post(a.url + "/v1/chat/completions", json=chat("shared"))
        assert r.status_code == 200, r.text
        assert ("shared", 200) in c_host.answered and not b.answered
        # beta is only on B: 503 at once, naming B, and no hang
        r = await c.post(a.url + "/v1/chat/completions", json=chat("beta"))
        assert r.status_code == 503, r.text
        message = r.json()["error"]["message"]
        assert "b is down" in message and "127.0.0.1" not in message, message
        models = await listed(a)
        assert models["beta"]["lokid"]["state"] == "unavailable"
        assert models["shared"]["lokid"]["host"] == "c"
        # the daemon is told (lokictl presets and top, Prometheus's lokid_peer_up)
        assert a.running is not None
        manager = await a.running.iface(OBJECT_PATH, MANAGER_INTERFACE)

        async def b_down() -> bool:
            peers = await manager.get_peers()
            return peers.get("c") == "" and peers.get("b", "").startswith("cannot connect")

        await until(b_down, 20, "A's daemon told that B is down")
        ctl = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "lokid.ctl", "--address", a.address, "presets",
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT)
        shown = (await asyncio.wait_for(ctl.communicate(), 60))[0].decode()
        assert "peer gateways:\n  b: DOWN: cannot connect (Connection refused)\n  c: up" \
            in shown, shown
        # back up: routed to B again
        await b.start_gateway()
        await until(lambda: all_up(a), 20, "B seen up again")
        r = await c.post(a.url + "/v1/chat/completions", json=chat("beta"))
        assert r.status_code == 200, r.text
        assert ("beta", 200) in b.answered


async def test_a_request_that_reached_no_peer_goes_to_the_next_replica(
        fleet: dict[str, Host], monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    """B gone before A read its peers again: the request's connect to B is refused (no
    byte reached it), so it goes to C, and B is marked down by that request (then read
    again at once, which says the same in its own words)."""
    a, b, c_host = fleet["a"], fleet["b"], fleet["c"]
    await until(lambda: all_up(a), 20, "A's peers read")
    assert a.gateway is not None
    monkeypatch.setattr(peers_mod, "POLL_EVERY", 3600.0)
    await asyncio.sleep(1.0)   # the last read at 0.5 s ended; the next is an hour away
    await b.stop_gateway()
    assert a.gateway.peers.summary()["b"] == ""   # A does not know yet
    async with client() as c:
        r = await c.post(a.url + "/v1/chat/completions", json=chat("shared"))
    assert r.status_code == 200, r.text
    assert ("shared", 200) in c_host.answered and not b.answered
    assert "peer gateway b is down: a request could not reach it" in caplog.text
    assert a.gateway.peers.summary()["b"] != ""


async def test_a_marked_request_is_never_sent_on(fleet: dict[str, Host]) -> None:
    """A request carrying the hop mark is answered from the host's own presets: peers
    that list each other cannot loop; a name no host has is 404 everywhere."""
    a, b = fleet["a"], fleet["b"]
    await until(lambda: all_up(a), 20, "A's peers read")
    async with client() as c:
        r = await c.post(a.url + "/v1/chat/completions", json=chat("beta"),
                         headers={HOP_HEADER: "1"})
        assert r.status_code == 404, r.text
        assert "the known ones are alpha" in r.text and "beta" not in r.json()["error"][
            "message"].split("known ones")[1], r.text   # this host's only
        assert not b.answered
        r = await c.post(a.url + "/v1/chat/completions", json=chat("nowhere"))
        assert r.status_code == 404, r.text
        assert r.json()["error"]["code"] == "model_not_found"
        # a client's 404 names the fleet's models, not only this host's
        assert "the known ones are alpha, beta, shared" in r.json()["error"]["message"], r.text


async def test_a_peer_whose_key_is_refused_is_down_with_why(
        tmp_path: Path, fleet: dict[str, Host]) -> None:
    """A peer key the peer refuses: the peer is down "answered 401 (is its key
    right?)", and its models are unavailable, never asked with a client's key."""
    a = fleet["a"]
    await a.stop_gateway()
    wrong = tmp_path / "wrong.key"
    wrong.write_text("not-a-key-of-b\n")
    a.settings["peers"] = (Peer("b", fleet["b"].url, str(wrong)),)
    await a.start_gateway()
    assert a.gateway is not None
    gateway = a.gateway
    await until(lambda: asyncio.sleep(0, "401" in gateway.peers.summary()["b"]), 20,
                "B refused")
    assert "is its key right" in gateway.peers.summary()["b"]
    async with client() as c:
        r = await c.post(a.url + "/v1/chat/completions", json=chat("beta"))
    assert r.status_code == 503 and "b is down" in r.json()["error"]["message"]
    assert not fleet["b"].answered


async def test_a_host_unloading_its_replica_sends_new_requests_to_a_ready_one(
        fleet: dict[str, Host], monkeypatch: pytest.MonkeyPatch) -> None:
    """``lokictl unload shared`` on B while C's replica is ready: B's gateway sends the
    requests that come meanwhile to C, not to the engine being unloaded, and lists its
    own as stopping; once the unload ended, B serves again. (The unload is held open
    at its start by a gate here: with nothing in flight it lasts a few milliseconds.)"""
    b, c_host = fleet["b"], fleet["c"]
    await until(lambda: all_up(b), 20, "B's peers read")
    async with client("client-key-c") as c:
        r = await c.post(c_host.url + "/v1/chat/completions", json=chat("shared"))
        assert r.status_code == 200, r.text   # C's replica started: ready there
    assert b.running is not None and b.gateway is not None
    gateway, unloads = b.gateway, b.running.daemon.unloads
    gate = asyncio.Event()
    drain_and_stop = unloads._drain_and_stop

    async def held(name: str) -> Any:
        await gate.wait()
        return await drain_and_stop(name)

    monkeypatch.setattr(unloads, "_drain_and_stop", held)
    async with client("client-key-b") as c:
        r = await c.post(b.url + "/v1/chat/completions", json=chat("shared"))
        assert r.status_code == 200 and b.answered == [("shared", 200)], b.answered
        await until(lambda: asyncio.sleep(0, gateway.peers.listing().get("shared", {})
                                          .get("c", {}).get("state") == "ready"), 20,
                    "C's replica seen ready by B")
        manager = await b.running.iface(OBJECT_PATH, MANAGER_INTERFACE)
        await manager.call_unload_preset("shared")
        await until(lambda: asyncio.sleep(0, gateway.presets.presets["shared"].unloading),
                    10, "B's gateway told of the unload")
        c_host.answered.clear()
        r = await c.post(b.url + "/v1/chat/completions", json=chat("shared"))
        assert r.status_code == 200, r.text
        assert c_host.answered == [("shared", 200)] and b.answered == [("shared", 200)]
        mine = (await listed(b, "client-key-b", **{HOP_HEADER: "1"}))["shared"]["lokid"]
        assert mine["state"] == "stopping" and mine["status"] == "unloading", mine
        ctl = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "lokid.ctl", "--address", b.address, "presets",
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT)
        shown = (await asyncio.wait_for(ctl.communicate(), 60))[0].decode()
        assert any(line.split()[:3] == ["shared", "ready", "(unloading)"]
                   for line in shown.splitlines()), shown
        gate.set()
        await until(lambda: asyncio.sleep(0, not gateway.presets.presets["shared"].unloading
                                          and gateway.presets.presets["shared"].state
                                          == "inactive"), 30, "B's unload ended")
