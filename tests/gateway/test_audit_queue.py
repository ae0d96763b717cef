"""The audit record leaves the request's path (issue 46, cost): queued by
:meth:`lokid.gateway.audit.Audit.post`, written by the event loop at its next turn, a
bounded queue whose drops are counted and said, what waits written at the stop."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest

from lokid.gateway import audit as audit_mod
from lokid.gateway.audit import Audit, Record
from lokid.gateway.figures import UNKNOWN


def record(key: str = "alice") -> Record:
    return Record(key, "alpha", "/v1/chat/completions", 200, UNKNOWN, 0.0, 1.0, 2.0,
                  "local", False)


def sender(got: list[str]) -> Any:
    return lambda _message, **fields: got.append(fields["LOKID_KEY"])


async def test_written_after_the_turn_not_on_the_path() -> None:
    got: list[str] = []
    audit = Audit(sender(got))
    audit.post(record("a"))
    audit.post(record("b"))
    assert got == []   # not written on the request's path
    await asyncio.sleep(0)
    assert got == ["a", "b"]   # in order, at the loop's next turn
    assert not audit.queued and not audit.scheduled


async def test_a_burst_is_written_a_batch_a_turn(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(audit_mod, "BATCH", 2)
    got: list[str] = []
    audit = Audit(sender(got))
    for i in range(5):
        audit.post(record(f"k{i}"))
    await asyncio.sleep(0)
    assert got == ["k0", "k1"]
    for _ in range(3):
        await asyncio.sleep(0)
    assert got == [f"k{i}" for i in range(5)]


async def test_past_its_bound_records_are_dropped_counted_and_said(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setattr(audit_mod, "MAX_QUEUED", 3)
    got: list[str] = []
    audit = Audit(sender(got))
    with caplog.at_level(logging.WARNING, "lokid.gateway"):
        for i in range(6):
            audit.post(record(f"k{i}"))
        assert audit.dropped == 3
        said = [r.getMessage() for r in caplog.records]
        assert len([m for m in said if "new ones are dropped" in m]) == 1   # once a burst
        await asyncio.sleep(0)
        assert got == ["k0", "k1", "k2"]
        assert any("3 records were dropped in all" in r.getMessage() for r in caplog.records)


async def test_flush_writes_what_waits() -> None:
    got: list[str] = []
    audit = Audit(sender(got))
    audit.post(record("a"))
    audit.flush()
    assert got == ["a"]
    await asyncio.sleep(0)   # the turn that was due finds nothing left
    assert got == ["a"]


def test_without_a_loop_written_at_once() -> None:
    got: list[str] = []
    Audit(sender(got)).post(record("a"))
    assert got == ["a"]
