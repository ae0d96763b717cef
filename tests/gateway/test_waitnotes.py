"""What a waiting request is told and what the daemon is told of it (issue 46, item 4):
:class:`lokid.gateway.waitnotes.Teller`'s words and :meth:`lokid.gateway.waiting.Waiting.rows`
over a real :class:`lokid.core.serve.fairshare.FairShare` (the gate's rule); the groups, the
placement and the presets are their plain state, as the gateway's own hold it."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from lokid.core.serve.fairshare import DEFAULT_PACE, FairShare
from lokid.core.serve.waiting import Row
from lokid.gateway.context import TICKET_KEY
from lokid.gateway.waiting import Waiting
from lokid.gateway.waitnotes import Teller


def waiting(share: FairShare, **kw: Any) -> Waiting:
    return Waiting(None, share, SimpleNamespace(groups=kw.get("groups", {})),  # type: ignore[arg-type]
                   SimpleNamespace(waiting=kw.get("placing", []), reported=kw.get("said", {})),
                   SimpleNamespace(presets=kw.get("presets", {})))


async def test_a_teller_says_the_place_at_the_gate_else_why_the_engine_waits() -> None:
    share = FairShare()
    share.arrive("alpha", "alice", slots=1, now=0.0)   # in the only slot
    share.arrive("alpha", "bob", slots=1, now=0.0)
    carol = share.arrive("alpha", "carol", slots=1, now=0.0)
    w = waiting(share)
    told = Teller({TICKET_KEY: carol}, "alpha", share, w)  # type: ignore[arg-type]
    assert told.say() == f"waiting, 1 ahead (slots busy (1/1)), about {DEFAULT_PACE * 2:.0f} s"
    await told.stop()
    cold = Teller({}, "qwen", share, w)  # type: ignore[arg-type]
    assert cold.say() == "waiting (loading qwen, 0 s)"
    await cold.stop()
    placing = waiting(share, placing=[SimpleNamespace(preset="qwen")],
                      said={"qwen": "needs 18.2 GiB on GPU0"})
    assert Teller({}, "qwen", share, placing).say() == \
        "waiting (placement: needs 18.2 GiB on GPU0, 0 s)"  # type: ignore[arg-type]


def test_rows_per_key_class_and_why_with_the_oldest_wait() -> None:
    share = FairShare()
    share.arrive("alpha", "alice", slots=1, now=0.0)
    share.arrive("alpha", "bob", slots=1, now=1.0)
    share.arrive("alpha", "bob", slots=1, now=2.0)
    share.arrive("alpha", "job", batch=True, slots=1, now=3.0)
    w = waiting(share, presets={"beta": SimpleNamespace(group="g")},
                groups={"g": SimpleNamespace(name="g", swapping=False, turn="alpha")})
    w.before[object()] = ("beta", "carol", False, 4.0)
    assert w.rows(10.0) == [
        Row("alpha", "bob", False, 2, 9.0, "slots busy (1/1)"),
        Row("alpha", "job", True, 1, 7.0, "slots busy (1/1)"),
        Row("beta", "carol", False, 1, 6.0, "swap (group g held by alpha)")]
