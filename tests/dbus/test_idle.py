"""Idle stop (lokid.dbus.idle) with the real engine under the daemon's local runner, on a
private real dbus-daemon: a preset with serve.idle_stop = "3s" is stopped about 3 s after
its last request ended, not while a slow streaming request is in flight, and not kept
alive by an idle keep-alive connection; a preset without idle_stop is never stopped.
The pure rule and lokictl's wording of it, without processes.

Times are asserted within generous bounds only: the machine is shared and noisy.
"""

from __future__ import annotations

import asyncio
import http.client
import json
import logging
import socket
import time
from pathlib import Path
from typing import Any

import pytest
from support.daemonkit import Running
from support.enginekit import free_port, write_config, write_preset

from lokid.core.names import MANAGER_INTERFACE, OBJECT_PATH, PRESET_INTERFACE, preset_object_path
from lokid.core.telemetry.requestlog import EngineLog
from lokid.ctl.commands import idle_text, serve_text
from lokid.dbus.idle import idle_deadline

IDLE = 3.0


# --- the rule, pure ---------------------------------------------------------------------


def test_the_deadline_counts_from_ready_or_the_last_request_and_waits_for_one_in_flight(
        ) -> None:
    assert idle_deadline(None, 100.0, 0, None) is None          # no idle_stop: never
    assert idle_deadline(3.0, 100.0, 0, None) == 103.0          # from READY
    assert idle_deadline(3.0, 100.0, 0, 150.0) == 153.0         # from the last request's end
    assert idle_deadline(3.0, 100.0, 0, 90.0) == 103.0          # a request before READY
    assert idle_deadline(3.0, 100.0, 1, 150.0) is None          # one in flight: not now


def test_all_slots_idle_ends_a_request_whose_release_line_was_lost() -> None:
    """Real lines (tests/data/engine-logs/b11434-cuda-h200-mid_off.log): without the
    release line, the request would be in flight for ever and the engine never idle."""
    log = EngineLog()
    log.feed("0.07.629.506 I slot launch_slot_: id  2 | task 19 | processing task, "
             "is_child = 0", 1.0)
    assert log.in_flight == {(2, 19)}
    log.feed("0.07.773.095 I srv  update_slots: all slots are idle", 2.0)
    assert log.in_flight == set()


def test_lokictl_says_when_the_engine_stops_and_how_it_is_served() -> None:
    row: dict[str, Any] = {"IdleStopAt": 1000.0 + 12 * 60, "IdleStop": 900.0}
    assert idle_text(row, 1000.0) == "stops in 12min without a request"
    assert idle_text(row, 1000.0 + 12 * 60 - 45) == "stops in 45s without a request"
    assert idle_text(row, 2000.0) == "stopping: no request for 15min"
    assert idle_text({"IdleStopAt": 0.0}, 1000.0) == ""
    assert serve_text({"OnDemand": True, "IdleStop": 900.0, "Group": "gpu0",
                       "Drain": 120.0}) == "on demand, idle_stop 15min, group gpu0 (drain 2min)"
    assert serve_text({"OnDemand": False, "IdleStop": 0.0, "Group": ""}) == \
        "by hand (no [serve] settings)"


# --- the real engine under the local runner ---------------------------------------------


@pytest.fixture
def ports() -> dict[str, int]:
    return {"idle": free_port(), "plain": free_port()}


@pytest.fixture
def config(tmp_path: Path, engine: str, models: Any, ports: dict[str, int]) -> Path:
    config = write_config(tmp_path, engine, [models.dir])
    assert Path(models.llama_long).name == "llama-long.gguf"
    # one thread and a long context: a request of 6,000 tokens takes seconds (9 s here)
    body = 'model = "llama-long.gguf"\nctx = 8192\nextra_args = ["-t", "1"]\nport = {}\n'
    write_preset(config, "idle", body.format(ports["idle"]) + f'[serve]\nidle_stop = "{IDLE:g}s"\n')
    write_preset(config, "plain", body.format(ports["plain"]))
    return config


def complete(port: int, n_predict: int, stream: bool = False) -> tuple[float, int]:
    """One /completion request on its own connection: (when its last byte came, the tokens
    predicted)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    try:
        conn.request("POST", "/completion", json.dumps(
            {"prompt": "hello", "n_predict": n_predict, "ignore_eos": True, "stream": stream}),
            {"Content-Type": "application/json"})
        resp = conn.getresponse()
        assert resp.status == 200, resp.read()
        if not stream:
            return time.time(), int(json.loads(resp.read())["tokens_predicted"])
        last: dict[str, Any] = {}
        for raw in resp:   # one server-sent event a line, read as it comes
            if raw.startswith(b"data: "):
                last = json.loads(raw[6:])
        assert last.get("stop") is True, last
        return time.time(), int(last["tokens_predicted"])
    finally:
        conn.close()


async def stop_at(running: Running, preset: str, after: int, timeout: float) -> float:
    """When the daemon announced ``preset`` stopping (time.time())."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if any(e[0] == preset and e[1] == "stopping" for e in running.events[after:]):
            return time.time()
        await asyncio.sleep(0.05)
    raise AssertionError(f"{preset} not stopped in {timeout} s: {running.events}")


async def start(running: Running, *names: str) -> None:
    manager = await running.iface(OBJECT_PATH, MANAGER_INTERFACE)
    for name in names:
        await manager.call_start_preset(name)
    for name in names:
        await running.wait_event(name, "ready")



@pytest.mark.engine
@pytest.mark.slow
async def test_an_idle_keep_alive_connection_does_not_keep_the_engine_and_a_preset_without_idle_stop_runs_on(  # noqa: E501
        running: Running, ports: dict[str, int], caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="lokid.daemon")
    await start(running, "idle", "plain")
    seen = len(running.events)
    idle = await running.iface(preset_object_path("idle"), PRESET_INTERFACE)
    assert await idle.get_idle_stop() == IDLE and await idle.get_on_demand() is False
    plain = await running.iface(preset_object_path("plain"), PRESET_INTERFACE)
    assert await plain.get_idle_stop() == 0.0 and await plain.get_idle_stop_at() == 0.0

    # a keep-alive connection that served one request, then stays open, idle; and a
    # connection that never sends a request at all
    keep = http.client.HTTPConnection("127.0.0.1", ports["idle"], timeout=30)
    bare = socket.create_connection(("127.0.0.1", ports["idle"]))
    try:
        def one() -> float:
            keep.request("POST", "/completion", json.dumps({"prompt": "hi", "n_predict": 8}),
                         {"Content-Type": "application/json", "Connection": "keep-alive"})
            resp = keep.getresponse()
            assert resp.status == 200 and not resp.will_close
            resp.read()
            return time.time()

        ended = await asyncio.to_thread(one)
        await asyncio.sleep(0.5)
        planned = await idle.get_idle_stop_at()
        assert ended + IDLE - 1.5 <= planned <= ended + IDLE + 1.0, (planned, ended)
        stopped = await stop_at(running, "idle", seen, timeout=IDLE + 20)
    finally:
        keep.close()
        bare.close()
    assert IDLE - 1.0 <= stopped - ended <= IDLE + 15, stopped - ended
    await running.wait_event("idle", "inactive", after=seen)
    assert await idle.get_idle_stop_at() == 0.0
    assert (await idle.get_stats()).get("idle_stops").value == 1
    assert any(r.getMessage() == "preset idle: stopped after 3s without a request "
               "(serve.idle_stop)" for r in caplog.records), [r.getMessage()
                                                              for r in caplog.records]
    # the preset without idle_stop: ready all along, and still after as long again
    await asyncio.sleep(IDLE + 2)
    assert [e for e in running.events[seen:] if e[0] == "plain"] == []
    assert await plain.get_state() == "ready"


@pytest.mark.engine
@pytest.mark.slow
async def test_a_streaming_request_in_flight_defers_the_stop_until_after_its_end(
        running: Running, ports: dict[str, int]) -> None:
    await start(running, "idle")
    seen = len(running.events)
    idle = await running.iface(preset_object_path("idle"), PRESET_INTERFACE)
    began = time.time()
    stream = asyncio.ensure_future(asyncio.to_thread(complete, ports["idle"], 6000, True))
    await asyncio.sleep(IDLE + 1.0)
    if not stream.done():   # the request is in flight past idle_stop: no stop planned
        assert await idle.get_idle_stop_at() == 0.0
    ended, tokens = await stream
    assert tokens == 6000    # the stream ran to its end, never cut
    assert ended - began > IDLE + 1.0, "the request was too quick to prove anything"
    assert [e for e in running.events[seen:] if e[0] == "idle"] == []   # ready throughout
    stopped = await stop_at(running, "idle", seen, timeout=IDLE + 20)
    assert IDLE - 1.0 <= stopped - ended <= IDLE + 15, stopped - ended
