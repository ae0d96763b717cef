"""The gate wakes every request an arrival lets in (issue 46, items 3 and 4).

Found by scripts/walk_team.py in the Debian 13 container: a batch key's stream waited at
the gateway for ever on an idle engine. A batch request held back by the interactive
reserve stays queued; once the reserve shrinks (its minute of demand over), the next
arrival's pass over the queue (FairShare.arrive) admits it beside the newcomer, and the
gate woke only the newcomer: the batch request's slot was taken and its client never
answered. Here with the real Admission and FairShare, aiohttp's own request objects and
the gate's clock moved by hand (the reserve's minute is not waited for)."""

from __future__ import annotations

import asyncio
import contextlib
from types import SimpleNamespace
from typing import Any

import pytest
from aiohttp.test_utils import make_mocked_request

from lokid.core.serve.fairshare import RECENT
from lokid.core.serve.keys import BATCH, Identity
from lokid.gateway import admission as admission_mod
from lokid.gateway.admission import Admission
from lokid.gateway.context import IDENTITY_KEY
from lokid.gateway.presets import Preset

ROUTE = "/v1/chat/completions"


def request(key: str, klass: str = "interactive") -> Any:
    r = make_mocked_request("POST", ROUTE)
    r[IDENTITY_KEY] = Identity(key, klass=klass)
    return r


async def test_a_batch_request_let_in_by_an_arrival_is_woken(
        monkeypatch: pytest.MonkeyPatch) -> None:
    clock = [1000.0]
    # the gate's clock only (asyncio's own stays time.monotonic)
    monkeypatch.setattr(admission_mod, "time", SimpleNamespace(monotonic=lambda: clock[0]))
    gate = Admission(512, 128, lambda: None, lambda _name: None)
    preset = Preset("a", state="ready", argv=("llama-server", "-np", "4"))
    inside: dict[str, asyncio.Event] = {}
    leave: dict[str, asyncio.Event] = {}

    async def hold(name: str, klass: str = "interactive") -> None:
        async with gate.gate(request(name, klass), preset, "", ROUTE):
            inside[name].set()
            await leave[name].wait()

    tasks: dict[str, asyncio.Task[None]] = {}

    def start(name: str, klass: str = "interactive") -> None:
        inside[name], leave[name] = asyncio.Event(), asyncio.Event()
        tasks[name] = asyncio.create_task(hold(name, klass))

    start("b0", BATCH)
    await asyncio.wait_for(inside["b0"].wait(), 5)
    for n in ("i1", "i2", "i3"):          # three people: a reserve of 3 slots
        start(n)
        await asyncio.wait_for(inside[n].wait(), 5)
    start("b1", BATCH)
    await asyncio.sleep(0.05)
    assert not inside["b1"].is_set()      # 0 slots free: it waits
    for n in ("i1", "i2", "i3"):
        leave[n].set()
        await tasks[n]
    await asyncio.sleep(0.05)
    assert not inside["b1"].is_set()      # 3 free, the reserve 3 for a minute: it waits
    clock[0] += RECENT + 1                # the reserve is 1 now; a person comes back
    start("i4")
    await asyncio.wait_for(inside["i4"].wait(), 5)
    # i4's arrival admitted b1 too (2 free, reserve 1): b1 must be told
    await asyncio.wait_for(inside["b1"].wait(), 5)
    for n in ("b0", "b1", "i4"):
        leave[n].set()
    for t in tasks.values():
        with contextlib.suppress(asyncio.CancelledError):
            await t
    assert gate.share.running("a") == 0 and not gate.waiters
