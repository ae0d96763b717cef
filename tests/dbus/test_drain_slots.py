"""A roll's drain (lokid.dbus.replicas) when the engine's log counts a request in flight:
the engine's /slots (a real HTTP server in llama-server's shape) decides between a count
gone stale and a request served. Serving none, the drain ends and says why; serving, or
not answering, it waits its whole drain as before and says what the engine last said.
The real engines' case is test_replicas_daemon's roll with a stale count."""

from __future__ import annotations

import logging
from types import SimpleNamespace
from typing import Any

import pytest
from aiohttp import web
from support.enginekit import free_ports
from support.gatewaykit import app_on_loopback

from lokid.dbus.replicas import Replicas
from lokid.runners.runner import READY, EngineState


def replicas_of(port: int) -> Replicas:
    """Replicas of preset m (its engine's port ``port - 1``: m:2 listens on ``port``),
    m:2 ready, its log counting one request in flight."""
    view = SimpleNamespace(listen=("127.0.0.1", port - 1))
    start = SimpleNamespace(log=SimpleNamespace(in_flight={(0, 9)}))
    host: Any = SimpleNamespace(
        exported={}, registry=SimpleNamespace(presets={"m": view}),
        runner=SimpleNamespace(state=lambda _name: EngineState(READY)),
        telemetry=SimpleNamespace(meters=SimpleNamespace(starts={"m:2": start})))
    return Replicas(host)


@pytest.mark.parametrize("processing", [False, True, None])
async def test_a_drain_held_by_the_log_count_asks_the_engine(
        processing: bool | None, caplog: pytest.LogCaptureFixture) -> None:
    asked = []

    async def slots(_r: web.Request) -> web.Response:
        asked.append(1)
        if processing is None:   # an engine started with --no-slots
            return web.json_response({"error": {"code": 501}}, status=501)
        return web.json_response([{"id": 0, "is_processing": processing},
                                  {"id": 1, "is_processing": False}])

    app = web.Application()
    app.router.add_get("/slots", slots)
    port = free_ports(1)
    caplog.set_level(logging.INFO, logger="lokid.daemon")
    async with app_on_loopback(app, port):
        replicas = replicas_of(port)
        await replicas._drained("m:2", 2.0)
    said = [r.getMessage() for r in caplog.records if r.name == "lokid.daemon"]
    if processing is False:
        assert said == ["m:2: drained: its log still counts 1 requests in flight, its "
                        "engine's /slots serves none (the count is stale)"]
        assert len(asked) == 2   # asked twice, 0.3 s apart, before it is believed
    else:
        word = "serves" if processing else "did not say (no answer, no /slots, or a key)"
        assert said == [f"m:2: its drain (2 s) passed with 1 requests in flight (its "
                        f"engine's /slots, last asked: {word}): restarted"]
        assert len(asked) >= 2   # asked again while it drains (every ROLL_ASK)
