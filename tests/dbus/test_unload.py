"""``lokictl unload`` (UnloadPreset) with the real engine under the daemon's local runner,
on a private real dbus-daemon: a streaming request in flight finishes in full, then the
engine stops, and lokictl says what it waited for; an engine without a request stops at
once. And GatewayReport: refused to anyone but root and the gateway's user, even with
the manage right, and checked."""

from __future__ import annotations

import asyncio
import http.client
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from dbus_fast import DBusError
from support.daemonkit import Running, daemon_on
from support.enginekit import free_port, write_config, write_preset

from lokid.core.access import User
from lokid.core.names import BUS_NAME, MANAGER_INTERFACE, OBJECT_PATH, PRESET_INTERFACE
from lokid.core.names import preset_object_path as path_of

pytestmark = [pytest.mark.engine, pytest.mark.slow]

TOKENS = 3000


@pytest.fixture
def ports() -> dict[str, int]:
    return {"long": free_port()}


@pytest.fixture
def config(tmp_path: Path, engine: str, models: Any, ports: dict[str, int]) -> Path:
    config = write_config(tmp_path, engine, [models.dir])
    assert Path(models.llama_long).name == "llama-long.gguf"
    # one thread: a request of 3,000 tokens streams for seconds
    write_preset(config, "long", 'model = "llama-long.gguf"\nctx = 8192\nextra_args = ["-t", '
                 f'"1"]\nport = {ports["long"]}\n[serve]\ngroup = "g"\n')
    return config


def complete(port: int, n_predict: int) -> tuple[float, int]:
    """One streamed /completion request read whole: (when its last event came, the tokens
    predicted)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    try:
        conn.request("POST", "/completion", json.dumps(
            {"prompt": "hello", "n_predict": n_predict, "ignore_eos": True, "stream": True}),
            {"Content-Type": "application/json"})
        resp = conn.getresponse()
        assert resp.status == 200, resp.read()
        last: dict[str, Any] = {}
        for raw in resp:   # one server-sent event a line, read as it comes
            if raw.startswith(b"data: "):
                last = json.loads(raw[6:])
        assert last.get("stop") is True, last
        return time.time(), int(last["tokens_predicted"])
    finally:
        conn.close()


def lokictl(address: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "lokid.ctl", "--address", address, *args],
                          capture_output=True, text=True, timeout=120)


async def test_unload_lets_a_streaming_request_finish_in_full_then_stops(
        running: Running, ports: dict[str, int], bus_address: str) -> None:
    manager = await running.iface(OBJECT_PATH, MANAGER_INTERFACE)
    preset = await running.iface(path_of("long"), PRESET_INTERFACE)
    await manager.call_start_preset("long")
    await running.wait_event("long", "ready")
    seen = len(running.events)
    stream = asyncio.ensure_future(asyncio.to_thread(complete, ports["long"], TOKENS))
    deadline = time.monotonic() + 30
    while await preset.get_requests_in_flight() != 1:
        assert time.monotonic() < deadline and not stream.done(), "no request in flight"
        await asyncio.sleep(0.05)
    asked = time.time()
    unload = asyncio.ensure_future(asyncio.to_thread(lokictl, bus_address, "unload", "long"))
    ended, tokens = await stream
    assert tokens == TOKENS        # the stream ran to its end, never cut
    r = await unload
    assert r.returncode == 0, r
    assert ended - asked > 0.5, "the request ended too soon after the unload to prove anything"
    stopping = next(i for i, e in enumerate(running.events) if i >= seen and e[0] == "long"
                    and e[1] == "stopping")
    assert running.events[stopping:][-1][:2] == ("long", "inactive")
    said = r.stdout.strip()
    assert said.startswith("long: inactive (waited "), said
    assert said.endswith("s for 1 request in flight to finish, then stopped)"), said
    waited = float(said.split("waited ")[1].split(" s")[0])
    assert ended - asked - 1.0 <= waited <= ended - asked + 1.0, (waited, ended - asked)

    # nothing in flight: stopped at once; and a name no preset has
    await manager.call_start_preset("long")
    await running.wait_event("long", "ready", after=stopping + 1)
    r = await asyncio.to_thread(lokictl, bus_address, "unload", "long")
    assert r.returncode == 0 and r.stdout.strip() == \
        "long: inactive (no request in flight, then stopped)", r
    r = await asyncio.to_thread(lokictl, bus_address, "unload", "absent")
    assert r.returncode == 4 and "absent" in r.stderr, r


def busctl_as(address: str, user: str, groups: str, *args: str
              ) -> subprocess.CompletedProcess[str]:
    """busctl as another user (setpriv: real uid, gid and supplementary groups)."""
    return subprocess.run(["setpriv", f"--reuid={user}", "--regid=nogroup",
                           f"--groups={groups}" if groups else "--clear-groups",
                           "busctl", f"--address={address}", *args],
                          capture_output=True, text=True, timeout=60)


async def test_a_gateway_report_is_taken_from_root_alone_and_checked(
        config: Path, tmp_path: Path, open_bus_address: str) -> None:
    report = ("call", BUS_NAME, OBJECT_PATH, MANAGER_INTERFACE, "GatewayReport",
              "a(squ)a(su)", "2", "long", "200", "3", "nope", "200", "1", "1", "g", "1")
    async with daemon_on(config, tmp_path, open_bus_address, manage_group="users") as running:
        # a member of the manage group may start and stop, not forge the gateway's figures
        r = await asyncio.to_thread(busctl_as, open_bus_address, "nobody", "users", *report)
        assert r.returncode != 0
        assert "only the gateway (user loki-gateway) or root may report" in r.stderr, r.stderr
        r = await asyncio.to_thread(busctl_as, open_bus_address, "nobody", "", *report)
        assert r.returncode != 0 and "membership of group" in r.stderr, r.stderr
        preset = await running.iface(path_of("long"), PRESET_INTERFACE)
        assert "gateway_requests" not in await preset.get_stats()
        # root (the gateway under test runs as the daemon's user): taken; the unknown
        # preset dropped
        manager = await running.iface(OBJECT_PATH, MANAGER_INTERFACE)
        await manager.call_gateway_report([["long", 200, 3], ["nope", 200, 1]], [["g", 1]])
        stats = await preset.get_stats()
        assert stats["gateway_requests"].value["200"].value == 3
        assert stats["group_swaps"].value == 1
        with pytest.raises(DBusError) as e:
            await manager.call_gateway_report([["long", 700, 1]], [])
        assert e.value.type == "org.freedesktop.DBus.Error.InvalidArgs"
        assert "700 is no HTTP status code" in e.value.text
        assert (await preset.get_stats())["gateway_requests"].value["200"].value == 3
        # why requests wait (lokictl top): the gateway's word alone, checked the same way
        waits = ("call", BUS_NAME, OBJECT_PATH, MANAGER_INTERFACE, "ReportWaits", "a{ss}",
                 "1", "long", "forged")
        r = await asyncio.to_thread(busctl_as, open_bus_address, "nobody", "users", *waits)
        assert r.returncode != 0
        assert "ReportWaits: only the gateway (user loki-gateway)" in r.stderr, r.stderr
        assert await manager.get_waits() == {}
        await manager.call_report_waits({"long": "1 request waiting 2 s: \x1b[2Jneeds",
                                         "nope": "x"})
        assert await manager.get_waits() == {"long": "1 request waiting 2 s: \\u001b[2Jneeds"}
        with pytest.raises(DBusError) as e:
            await manager.call_report_waits({"long": "x" * 2001})
        assert e.value.type == "org.freedesktop.DBus.Error.InvalidArgs"
        await manager.call_report_waits({})
        assert await manager.get_waits() == {}
        # which peer gateways are down (lokictl top, lokid_peer_up): the same
        peers = ("call", BUS_NAME, OBJECT_PATH, MANAGER_INTERFACE, "ReportPeers", "a{ss}",
                 "1", "gpu2", "forged")
        r = await asyncio.to_thread(busctl_as, open_bus_address, "nobody", "users", *peers)
        assert r.returncode != 0
        assert "ReportPeers: only the gateway (user loki-gateway)" in r.stderr, r.stderr
        assert await manager.get_peers() == {}
        await manager.call_report_peers({"gpu2": "", "gpu3": "cannot connect\x1b[2J"})
        assert await manager.get_peers() == {"gpu2": "", "gpu3": "cannot connect\\u001b[2J"}
        with pytest.raises(DBusError) as e:
            await manager.call_report_peers({f"p{i}": "" for i in range(65)})
        assert e.value.type == "org.freedesktop.DBus.Error.InvalidArgs"


def test_the_gateways_own_user_may_report() -> None:
    from lokid.dbus.sight import Sight

    sight = Sight(None, lambda name: None)  # type: ignore[arg-type]
    sight.check_reporter(None)   # root, or the daemon's own user
    sight.check_reporter(User("loki-gateway", 990, frozenset({990}), "loki-gateway"))
    with pytest.raises(Exception, match="uid 1000 is neither"):
        sight.check_reporter(User("alice", 1000, frozenset({1000}), "loki"))
