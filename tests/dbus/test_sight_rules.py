"""The on-demand sight's rules (lokid.dbus.sight), lokictl's wording of them
(lokid.ctl.sight), and the gateway's reporter (lokid.gateway.report) against a real
private bus where no daemon takes its reports: its counts are kept, bounded, and sent
once a daemon answers (tests/gateway/test_sight_gateway.py runs the whole path)."""

from __future__ import annotations

from collections import Counter
from types import SimpleNamespace
from typing import Any

import pytest
from dbus_fast.aio import MessageBus

from lokid.ctl import sight as ctlsight
from lokid.ctl.stats import cells, row
from lokid.dbus.sight import on_demand_state
from lokid.gateway import report as gwreport
from lokid.gateway.report import PRESET_KEY, Report


@pytest.mark.parametrize("args,said", [
    ((True, False, "inactive", False, False), "waiting for a request"),
    ((True, True, "inactive", False, True), "stopped when idle"),
    ((False, True, "inactive", False, True), "stopped when idle"),
    ((False, True, "inactive", False, False), ""),     # stops when idle, never starts so
    ((True, False, "loading", True, False), "starting for a request"),
    ((True, False, "loading", False, False), "starting"),   # started by hand
    ((True, False, "ready", True, False), "ready"),
    ((True, False, "failed", False, False), "failed"),
    ((False, False, "ready", False, False), ""),       # started by hand only
    ((False, False, "loading", True, False), "starting for a request"),  # on_demand edited
])
def test_the_on_demand_state(args: tuple[Any, ...], said: str) -> None:
    assert on_demand_state(*args) == said


def test_lokictl_words_the_state_the_last_request_the_holder_and_the_counters() -> None:
    props = {"Name": "qwen", "State": "inactive", "Model": "q.gguf",
             "OnDemandState": "waiting for a request", "LastRequestAt": 1000.0 - 300,
             "Group": "gpu0", "GroupHolder": "beta",
             "Stats": {"cold_starts": 2, "cold_start_waits": 2, "cold_start_wait_seconds": 5.0,
                       "cold_start_last_wait_seconds": 2.0, "group_swaps": 3,
                       "gateway_requests": {"200": 7, "503": 1}}}
    assert ctlsight.sight_text(props, 1000.0) == \
        "waiting for a request, last request 5min ago, group gpu0 held by beta"
    assert ctlsight.sight_text({"Group": "gpu0"}, 1000.0) == "group gpu0 free"
    assert ctlsight.sight_text({}, 1000.0) == ""
    assert ctlsight.counters_text(props["Stats"]) == \
        "2 cold starts (mean wait 2.5 s, last 2.0 s), 3 group swaps, gateway: 200 x7, 503 x1"
    assert ctlsight.counters_text({}) == ""
    assert ctlsight.counters_text({"evictions": {"room": 2, "cut": 1}}) == \
        "3 evictions (cut 1, room 2)"
    top = row(props)
    assert cells(top)[1] == "inactive (waiting for a request)"
    assert top["group_holder"] == "beta" and top["cold_starts"] == 2
    assert cells(row({**props, "State": "ready", "OnDemandState": "ready"}))[1] == "ready"


def request(preset: str | None) -> dict[Any, Any]:
    """What the reporter reads of a request: its preset, set by the routes."""
    return {PRESET_KEY: preset} if preset else {}


async def test_the_gateways_counts_wait_for_a_daemon_that_takes_them(
        bus_address: str, monkeypatch: pytest.MonkeyPatch) -> None:
    bus = await MessageBus(bus_address=bus_address).connect()
    groups = SimpleNamespace(groups={"g": SimpleNamespace(swaps=1)})
    rep = Report(bus, groups)
    try:
        for status in (200, 200, 404, 499):
            rep.count(request("alpha"), status)   # type: ignore[arg-type]
        rep.count(request(None), 200)   # type: ignore[arg-type]  # /health: not a model's
        assert rep.pending == Counter({("alpha", 200): 2, ("alpha", 404): 1,
                                       ("alpha", 499): 1})
        await rep.send()   # nobody owns org.lokid.Lokid1 on this bus: kept
        assert rep.failure and sum(rep.pending.values()) == 4 and rep.swaps_sent == {}
        # bounded: new pairs past the bound are dropped, known ones still count
        monkeypatch.setattr(gwreport, "MAX_KEPT", 3)
        rep.count(request("beta"), 200)   # type: ignore[arg-type]
        rep.count(request("alpha"), 200)   # type: ignore[arg-type]
        assert ("beta", 200) not in rep.pending and rep.pending[("alpha", 200)] == 3
    finally:
        bus.disconnect()
