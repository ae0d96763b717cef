"""Idle stop: an engine with no request in flight for its preset's ``serve.idle_stop`` is
stopped by the daemon, the same stop as ``lokictl stop`` (issue 22, item 3).

Requests, not connections. systemd-socket-proxyd's ``--exit-idle-time=`` and a
proxy's own timers count open connections, so a client holding a keep-alive
connection open keeps a GPU busy for ever. The daemon already reads every line of
every engine (the journal under systemd, the pipe under the local runner) and its
parser (:mod:`lokid.core.telemetry.requestlog`) knows which requests are in flight: from a
slot's ``launch_slot_: … processing task`` to its ``release: … stop processing``
(``update_slots: all slots are idle`` ends them all). That holds for a request
through the gateway and one straight to the engine's port alike.

The rule (:func:`idle_deadline`, pure): no deadline while a request is in flight, nor
while the count is unknown (lines of the start were lost, :mod:`lokid.watch.meter`: a
lost launch line hides a running request; issue 45, item 9);
otherwise ``idle_stop`` after the later of the engine's READY (a load of ten minutes
is not ten idle minutes) and the end of its last request. After a restart of the
daemon a running engine's clock starts when the daemon sees it ready: what came
before is not known well enough to stop it sooner. The setting is read from the
registry at each check, so an edit of ``idle_stop`` applies without a restart.

:class:`IdleStops` follows the engines' states (``on_state``, from the daemon) and
is checked once a second (``check``, from the telemetry's publisher). A stop says
why in the journal (``preset qwen: stopped after 15min without a request``), is
counted (Stats ``idle_stops``, Prometheus ``lokid_idle_stops_total``), and is asked
once per READY: a stop that fails is logged, and the engine is left alone until it
is ready again. ``IdleStopAt`` (Unix time, 0 for none) says when the next one is due.

The same count is exported as ``RequestsInFlight``, announced the moment it moves (a
swap in a GPU group waits for it: :mod:`lokid.gateway.groups`): the requests of the
engine's current start, 0 when it is not ready.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from ..core.errors import LokiError, StalePlanError
from ..core.serve.replicas import is_replica, preset_of
from ..core.serve.tables import span_text
from ..runners.runner import READY, EngineState
from ..store.runtimedir import read_runtime_plan
from ..watch.meter import Meters, _Start
from .registry import Registry

log = logging.getLogger("lokid.daemon")


def idle_deadline(idle_stop: float | None, ready_at: float, in_flight: int,
                  last_end: float | None) -> float | None:
    """When an engine ready since ``ready_at`` is due to stop (Unix time), or None: never
    without ``idle_stop``, not while a request is in flight, else ``idle_stop`` after the
    later of READY and the end of its last request (``last_end``)."""
    if idle_stop is None or in_flight:
        return None
    return max(ready_at, last_end if last_end is not None else ready_at) + idle_stop


class IdleHost(Protocol):
    """What the idle stop needs of the daemon (the daemon is one)."""

    runtime_dir: str
    registry: Registry
    exported: dict[str, Any]   # preset → its PresetInterface

    def engine_state(self, name: str) -> EngineState: ...

    async def stop(self, name: str) -> str: ...


@dataclass
class _Clock:
    ready_at: float         # when the daemon saw this start ready
    invocation: str         # that start ("" when its runtime plan could not be read)
    asked: bool = False     # the stop was asked: not again before the next READY


class IdleStops:
    def __init__(self, host: IdleHost, meters: Meters):
        self.host = host
        self.meters = meters
        self.clocks: dict[str, _Clock] = {}
        self.counts: dict[str, int] = {}   # idle stops per preset since the daemon started
        # (preset, property) -> the value last announced (IdleStopAt, RequestsInFlight)
        self.said: dict[tuple[str, str], float] = {}
        meters.on_in_flight = self.announce_in_flight
        # told when an idle stop is asked (True) or failed (False): "stopped when idle"
        self.on_stop: Callable[[str, bool], None] | None = None

    def on_state(self, name: str, state: EngineState) -> None:
        """An engine's new state: READY starts its clock, any other state ends it."""
        if state.state == READY:
            if name not in self.clocks:
                self.clocks[name] = _Clock(time.time(), self._invocation(name))
        else:
            self.clocks.pop(name, None)
        self.announce(name)
        self.announce_in_flight(name)

    def _invocation(self, name: str) -> str:
        try:
            return read_runtime_plan(self.host.runtime_dir, name).invocation
        except (StalePlanError, OSError, ValueError):
            return ""

    def _start(self, name: str) -> _Start | None:
        """The meters of the ready engine's start (None: not ready, or no line yet): the
        figures of this start only, as an older start's requests in flight (it died
        serving them) must hold up neither its idle stop nor a swap."""
        clock = self.clocks.get(name)
        start = self.meters.starts.get(name)
        if clock is None or start is None:
            return None
        return start if not clock.invocation or start.invocation == clock.invocation else None

    def in_flight(self, name: str) -> int:
        """RequestsInFlight: the ready engines' requests in flight, from their log lines:
        the preset's own and its replicas' (issue 47: a stop or a swap stops them all)."""
        start = self._start(name)
        own = len(start.log.in_flight) if start is not None else 0
        return own + sum(len(s.log.in_flight) for s in self._replica_starts(name))

    def _replica_starts(self, name: str) -> list[_Start]:
        """The meters of the preset's replicas past the first whose engines are ready now
        (lokid.core.serve.replicas): an idle preset is one whose every engine is idle, since its
        idle stop stops them all."""
        return [s for key, s in self.meters.starts.items()
                if is_replica(key) and preset_of(key) == name
                and self.host.engine_state(key).state == READY]

    def announce_in_flight(self, name: str) -> None:
        """PropertiesChanged(RequestsInFlight) when it moved since last said."""
        self._say(name, "RequestsInFlight", self.in_flight(name))

    def deadline(self, name: str) -> float | None:
        """When the preset's engine is due to stop for idleness (Unix time), or None."""
        clock = self.clocks.get(name)
        view = self.host.registry.presets.get(name)
        if clock is None or view is None or clock.asked:
            return None
        in_flight, last_end = 0, None
        start = self._start(name)
        if start is not None:
            if not start.log.in_flight_known:
                return None   # lines were lost: requests in flight unknown, not none
            in_flight, last_end = len(start.log.in_flight), start.idle_since
        for other in self._replica_starts(name):   # a replica busy keeps them all
            if not other.log.in_flight_known:
                return None
            in_flight += len(other.log.in_flight)
            if other.idle_since is not None:
                last_end = max(last_end or 0.0, other.idle_since)
        return idle_deadline(view.serve.idle_stop, clock.ready_at, in_flight, last_end)

    def stop_at(self, name: str) -> float:
        """IdleStopAt: the deadline, 0 for none."""
        return self.deadline(name) or 0.0

    def announce(self, name: str) -> None:
        """PropertiesChanged(IdleStopAt) when it moved since last said."""
        self._say(name, "IdleStopAt", self.stop_at(name))

    def _say(self, name: str, prop: str, value: float) -> None:
        """PropertiesChanged(``prop``) of the preset's object, once per new value (0, what
        the property reads before anything was said, is not said)."""
        if self.said.get((name, prop), 0) == value:
            return
        self.said[(name, prop)] = value
        iface = self.host.exported.get(name)
        if iface is not None:
            iface.emit_properties_changed({prop: value})

    def count(self, name: str) -> int | None:
        """The preset's idle stops since the daemon started; None for a preset that has
        none and no idle_stop (no series for what cannot happen)."""
        view = self.host.registry.presets.get(name)
        if name in self.counts or (view is not None and view.serve.idle_stop is not None):
            return self.counts.get(name, 0)
        return None

    def stats(self, name: str) -> dict[str, Any]:
        """What the preset's Stats adds: idle_stops (since the daemon started) and
        idle_stop_at (the deadline), each when there is one."""
        out: dict[str, Any] = {}
        if self.counts.get(name):
            out["idle_stops"] = self.counts[name]
        at = self.deadline(name)
        if at is not None:
            out["idle_stop_at"] = at
        return out

    async def check(self, now: float | None = None) -> None:
        """Stop every engine past its deadline (once a second)."""
        now = time.time() if now is None else now
        for name in sorted(self.clocks):
            self.announce(name)
            self.announce_in_flight(name)   # a start's figures read again, or adopted
            at = self.deadline(name)
            if at is None or now < at or self.host.engine_state(name).state != READY:
                continue
            clock, view = self.clocks[name], self.host.registry.presets[name]
            clock.asked = True
            span = span_text(view.serve.idle_stop or 0.0)
            if self.on_stop is not None:
                self.on_stop(name, True)
            try:
                await self.host.stop(name)
            except LokiError as e:
                if self.on_stop is not None:
                    self.on_stop(name, False)
                log.warning("preset %s: not stopped after %s without a request: %s",
                            name, span, e)
                continue
            self.counts[name] = self.counts.get(name, 0) + 1
            log.info("preset %s: stopped after %s without a request (serve.idle_stop)",
                     name, span)
            self.announce(name)
