"""A holder's RequestsInFlight that lags (lokid.gateway.groups, issue 31): under systemd
the daemon counts an engine's requests from its log through the journal, up to 250 ms
late, and a swap waited for a request of the gateway's own that had ended. With none of
its own in flight and the daemon still counting some, the gateway asks the engine itself
(its /slots, here a stand-in engine over real HTTP): serving nothing, the figure is stale
until it moves; serving something (a client straight to the port), it holds."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from types import SimpleNamespace
from typing import Any

import pytest
from aiohttp import web
from support.gatewaykit import app_on_loopback

from lokid.gateway.groups import Group, _Waiter
from lokid.gateway.presets import Preset
from lokid.gateway.relay import session
from lokid.gateway.slots import SlotCache


class Engine:
    def __init__(self) -> None:
        self.processing = False
        self.asked = 0

    def app(self) -> web.Application:
        async def slots(_request: web.Request) -> web.Response:
            self.asked += 1
            return web.json_response([{"id": 0, "is_processing": False},
                                      {"id": 1, "is_processing": self.processing}])
        app = web.Application()
        app.router.add_get("/slots", slots)
        return app


@pytest.fixture
async def held() -> AsyncIterator[tuple[Group, Engine]]:
    engine = Engine()
    client = session()
    async with app_on_loopback(engine.app()) as url:
        members = {"A": Preset("A", state="ready", url=url, group="g", in_flight=1,
                               in_flight_at=5.0),
                   "B": Preset("B", group="g")}
        presets: Any = SimpleNamespace(presets=members)
        g = Group("g", presets, starter=None, max_wait=30.0,  # type: ignore[arg-type]
                  slots=SlotCache(lambda: client))
        g.turn, g.since = "A", 0.0
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        g.waiting.append(_Waiter(1, "B", 6.0, fut))   # B's request waits for the group
        # the scheduler is this test's to run: one that never ends holds its place
        g.task = asyncio.get_running_loop().create_task(asyncio.sleep(3600))
        yield g, engine
        g.task.cancel()
    await client.close()


def flight(g: Group, now: float) -> int:
    """The holder's requests in flight as the rule reads them."""
    holder = g.holder(now)
    assert holder is not None and holder.preset == "A"
    return holder.in_flight


async def asked(g: Group) -> None:
    g._ask_engine()
    task = g.figures.asking.get("A")
    if task is not None:
        await task


async def test_a_count_the_engine_denies_is_stale_until_it_moves(
        held: tuple[Group, Engine]) -> None:
    g, engine = held
    assert flight(g, 7.0) == 1   # the daemon's figure, as before
    await asked(g)
    assert engine.asked == 1 and flight(g, 7.0) == 0
    await asked(g)
    assert engine.asked == 1              # known stale: not asked again
    a = g.presets.presets["A"]
    a.in_flight, a.in_flight_at = 2, 8.0  # the figure moved (a request straight to the port)
    assert flight(g, 8.5) == 2


async def test_an_engine_that_serves_something_holds_the_swap(
        held: tuple[Group, Engine]) -> None:
    g, engine = held
    engine.processing = True
    await asked(g)
    assert engine.asked == 1 and flight(g, 7.0) == 1
    await asked(g)
    assert engine.asked == 1              # asked again only after ASK_AGAIN
    figure, at = g.figures.asked["A"]
    g.figures.asked["A"] = (figure, at - 1.0)
    engine.processing = False
    await asked(g)
    assert engine.asked == 2 and flight(g, 7.0) == 0


async def test_no_ask_while_the_gateway_has_its_own_or_nobody_else_waits(
        held: tuple[Group, Engine]) -> None:
    g, engine = held
    g.own["A"] += 1                       # the gateway's own request: the count is its own
    await asked(g)
    g.own["A"] -= 1
    waiting, g.waiting = g.waiting, []    # nobody waits for another preset: no swap to make
    await asked(g)
    g.waiting = waiting
    assert engine.asked == 0 and g.figures.stale == {}
    g.presets.presets["A"].url = "http://127.0.0.1:1"   # an engine that does not answer
    await asked(g)
    assert g.figures.stale == {} and flight(g, 7.0) == 1
