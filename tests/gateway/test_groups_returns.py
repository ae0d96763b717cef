"""How soon a group member's clients come back (lokid.gateway.groups): what the swap rule's
pause is for (lokid.core.serve.swaps, issue 31). Each request for a preset with nothing of its
own in flight or waiting notes how long after its last request ended it came; the holder
carries the shortest of the last few, and a request that joins others is no return."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

from lokid.core.serve.swaps import RETURNS_KEPT
from lokid.gateway.groups import Group
from lokid.gateway.presets import Preset


def group() -> Group:
    members = {"A": Preset("A", state="ready", url="http://127.0.0.1:1", group="g"),
               "B": Preset("B", group="g")}
    presets: Any = SimpleNamespace(presets=members)
    g = Group("g", presets, starter=None, max_wait=30.0, slots=None)  # type: ignore[arg-type]
    g.turn, g.since = "A", 0.0
    return g


async def test_the_holder_knows_how_soon_its_clients_came_back() -> None:
    g = group()
    assert g.holder(1.0).back is None   # never seen: the rule pauses
    g.own["A"] += 1                     # a request of A in flight...
    g._returned("A", 1.0)               # ...another one joining it is no return
    g.leave("A")                        # it ended: A idle from now
    ended = g.active_at["A"]
    g._returned("A", ended + 2.5)
    assert g.holder(ended + 3.0).back == 2.5
    g._returned("A", ended + 0.75)     # came back sooner once: that one counts
    assert g.holder(ended + 3.0).back == 0.75
    for _ in range(RETURNS_KEPT):       # ...until it is older than the last few
        g._returned("A", ended + 4.0)
    assert g.holder(ended + 5.0).back == 4.0


async def test_a_request_behind_a_waiting_one_is_no_return() -> None:
    g = group()
    g.active_at["B"] = 0.0
    fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    from lokid.gateway.groups import _Waiter

    g.waiting.append(_Waiter(1, "B", 0.5, fut))
    g._returned("B", 0.6)
    assert "B" not in g.returns
    g.waiting.clear()
    g._returned("B", 0.6)
    assert list(g.returns["B"]) == [0.6]
