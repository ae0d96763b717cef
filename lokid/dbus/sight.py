"""Sight of the presets served on demand (issue 22, item 6): their on-demand state, the
last request, who holds their GPU group, and the counters of cold starts, swaps and the
gateway's requests.

Who knows what, and why it is counted where it is:

- a **cold start** (a start asked for a request) is known here, from the start itself:
  the gateway asks it with ``StartForRequest`` instead of ``StartPreset``, so the daemon
  marks the start "for a request" the moment it is asked (``OnDemandState`` says
  "starting for a request" with the engine's first LOADING, never a second late) and
  times its wait on one clock, from the ask to READY, whatever the gateway does
  meanwhile (a gateway restarted mid-start, its client gone);
- a **swap** and the **gateway's requests** are known to the gateway only (a swap is its
  decision; a status code is its answer). It counts them itself and sends the deltas at
  most once a second, when they moved (``GatewayReport``, :mod:`lokid.gateway.report`):
  never a bus call per request. Only root, this daemon's user and the gateway's user
  (``loki-gateway``) may report: the manage right alone (group ``loki``) would let any
  operator forge the figures;
- the **last request** is the engine's own (its log's request lines, as the idle stop
  reads them), so a request straight to the engine's port counts too.

The states (:func:`on_demand_state`, pure) are for a preset served on demand or stopped
when idle; "" for a preset started by hand only. Every figure counts from the daemon's
start (a restart of the daemon sets them back to 0, a counter reset for Prometheus).

Bounds: a report names presets and groups the daemon knows (others are dropped: a
preset removed meanwhile), status codes 100 to 599, and at most :data:`MAX_REPORT`
entries; the counters are per known preset and code, so their size is bounded too.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from ..core.errors import InvalidArgsError, PermissionDeniedError, printable
from ..core.names import GATEWAY_USER
from ..runners.runner import FAILED, INACTIVE, LIVE, LOADING, READY, STOPPING, EngineState
from .registry import Registry

WAITING = "waiting for a request"
STARTING = "starting for a request"
STARTED_BY_HAND = "starting"
IDLE_STOPPED = "stopped when idle"
MAX_REPORT = 4096   # entries of one GatewayReport, at most
MAX_PEERS = 64      # peers in one ReportPeers (lokid.core.fleet.peers: at most 64)
PEERS_FRESH = 30.0  # seconds a ReportPeers holds (the gateway repeats it every 10 s)


def on_demand_state(on_demand: bool, idle_stop: bool, state: str, for_request: bool,
                    idle_stopped: bool) -> str:
    """OnDemandState: for a preset on demand (or with an idle stop), what it waits for.

    inactive: "stopped when idle" when its last stop was the idle stop, else "waiting for
    a request" (on demand; "" for a preset that only stops when idle); loading: "starting
    for a request" when the gateway asked it, else "starting"; ready: "ready"; stopping
    and failed as they are. "" for a preset neither on demand nor with an idle stop."""
    if not (on_demand or idle_stop or for_request):
        return ""
    if state == INACTIVE:
        if idle_stopped:
            return IDLE_STOPPED
        return WAITING if on_demand else ""
    if state == LOADING:
        return STARTING if for_request else STARTED_BY_HAND
    return state   # ready, stopping, failed


@dataclass
class ColdStarts:
    asked: int = 0          # starts asked for a request
    ready: int = 0          # of which became ready
    wait_sum: float = 0.0   # seconds from the ask to READY, summed over those
    last_wait: float | None = None


class SightHost(Protocol):
    """What the sight reads of the daemon (the daemon is one)."""

    registry: Registry
    exported: dict[str, Any]   # preset → its PresetInterface

    def engine_state(self, name: str) -> EngineState: ...


class Sight:
    def __init__(self, host: SightHost, mark: Callable[[str], None]):
        self.host = host
        self.mark = mark                         # the preset's Stats and textfile again
        self.asked: dict[str, float] = {}        # preset → when its start for a request was asked
        self.for_request: set[str] = set()       # its current start was asked for a request
        self.idle_stopped: set[str] = set()      # its last stop was the idle stop
        self.cold: dict[str, ColdStarts] = {}
        self.requests: dict[str, Counter[int]] = {}   # the gateway's, by status code
        self.swaps: Counter[str] = Counter()     # by group
        self.peer_word: dict[str, str] = {}      # the gateway's ReportPeers: peer → why down
        self.peers_at = float("-inf")
        self.evictions: dict[str, Counter[str]] = {}   # preset → reason → count
        self.last_request: dict[str, float] = {}
        self.said: dict[tuple[str, str], Any] = {}

    # --- what the daemon tells it -------------------------------------------------------

    def on_state(self, name: str, state: EngineState) -> None:
        st = state.state
        if st == LOADING and name in self.asked:
            self.for_request.add(name)
        if st == LOADING:   # a new start (READY comes again with each STATUS= line)
            self.idle_stopped.discard(name)
        if st == READY and name in self.asked:
            cold = self.cold.setdefault(name, ColdStarts())
            wait = max(0.0, time.time() - self.asked.pop(name))
            cold.ready += 1
            cold.wait_sum += wait
            cold.last_wait = wait
            self.mark(name)
        elif st in (INACTIVE, FAILED) and name in self.asked and name in self.for_request:
            del self.asked[name]   # the start for a request ended without READY
        if st not in LIVE:
            self.for_request.discard(name)
        self.announce(name)
        group = self._group(name)
        if group:
            for member in self._members(group):
                self._say(member, "GroupHolder", self.holder(member))

    def idle_stop(self, name: str, asked: bool) -> None:
        """The idle stop was asked (``asked``), or it failed and is no longer the reason."""
        if asked:
            self.idle_stopped.add(name)
        else:
            self.idle_stopped.discard(name)
        self.announce(name)

    def request_seen(self, name: str) -> None:
        """A request of the engine began or ended (its log lines)."""
        self.last_request[name] = time.time()

    async def start_for_request(self, name: str, start: Any) -> str:
        """StartForRequest: ``start(name)`` (the daemon's StartPreset), marked as asked for
        a request when the engine is not running yet (then a cold start)."""
        fresh = self.host.engine_state(name).state not in (LOADING, READY)
        if fresh:
            self.asked[name] = time.time()
        try:
            job = str(await start(name))
        except BaseException:
            if fresh:
                self.asked.pop(name, None)
            raise
        if fresh:
            self.cold.setdefault(name, ColdStarts()).asked += 1
            self.mark(name)
            if self.host.engine_state(name).state == LOADING:
                self.for_request.add(name)
                self.announce(name)
        return job

    def check_reporter(self, caller: Any, method: str = "GatewayReport") -> None:
        """Refuse a GatewayReport (or ReportWaits) from anyone but root, this daemon's
        user (``caller`` None) and the gateway's user."""
        if caller is None or getattr(caller, "name", "") == GATEWAY_USER:
            return
        raise PermissionDeniedError(
            f"{method}: only the gateway (user {GATEWAY_USER}) or root may report "
            f"figures (uid {getattr(caller, 'uid', '?')} is neither)")

    def report(self, requests: list[Any], swaps: list[Any]) -> None:
        """GatewayReport: the gateway's counts since its last report, added."""
        if len(requests) + len(swaps) > MAX_REPORT:
            raise InvalidArgsError(f"a GatewayReport holds at most {MAX_REPORT} entries")
        for _, code, _ in requests:
            if not 100 <= int(code) <= 599:
                raise InvalidArgsError(f"GatewayReport: {code} is no HTTP status code "
                                       "(100 to 599)")
        presets = self.host.registry.presets
        for preset, code, count in requests:
            if str(preset) in presets and int(count):
                self.requests.setdefault(str(preset), Counter())[int(code)] += int(count)
                self.mark(str(preset))
        groups = {v.serve.group for v in presets.values() if v.serve.group}
        for group, count in swaps:
            if str(group) in groups and int(count):
                self.swaps[str(group)] += int(count)
                for member in self._members(str(group)):
                    self.mark(member)

    def report_peers(self, peers: dict[str, str]) -> bool:
        """ReportPeers: each peer gateway of the gateway, "" when up, else why it is down,
        replacing the last word. Whether what :meth:`peers` shows changed."""
        if len(peers) > MAX_PEERS or any(len(k) > 64 or len(v) > 2000
                                         for k, v in peers.items()):
            raise InvalidArgsError(f"ReportPeers: at most {MAX_PEERS} peers, each name at "
                                   "most 64 characters and each why at most 2000")
        before = self.peers()
        self.peer_word = {printable(k): printable(v) for k, v in peers.items()}
        self.peers_at = time.monotonic()
        return self.peers() != before

    def peers(self) -> dict[str, str]:
        """The gateway's peers, "" for one up, else why it is down; {} once the gateway
        has not said so for PEERS_FRESH seconds (a gateway gone leaves nothing stale)."""
        if time.monotonic() - self.peers_at > PEERS_FRESH:
            return {}
        return dict(self.peer_word)

    # --- what it shows ------------------------------------------------------------------

    def state(self, name: str) -> str:
        view = self.host.registry.presets.get(name)
        if view is None:
            return ""
        state = self.host.engine_state(name).state
        if view.plan is None and state == INACTIVE:
            return ""   # broken: a request is refused with its reason, none starts it
        return on_demand_state(view.serve.on_demand, view.serve.idle_stop is not None,
                               state, name in self.for_request, name in self.idle_stopped)

    def holder(self, name: str) -> str:
        """GroupHolder: the member of the preset's group whose engine runs (ready first,
        then loading, then stopping), "" for none or without a group."""
        group = self._group(name)
        if not group:
            return ""
        order = {READY: 0, LOADING: 1, STOPPING: 2}
        live = sorted((order[st], m) for m in self._members(group)
                      if (st := self.host.engine_state(m).state) in order)
        return live[0][1] if live else ""

    def last_request_at(self, name: str) -> float:
        return self.last_request.get(name, 0.0)

    def stats(self, name: str) -> dict[str, Any]:
        """What the preset's Stats adds: cold_starts, cold_start_waits,
        cold_start_wait_seconds (the sum), cold_start_last_wait_seconds,
        gateway_requests (status code → count), group_swaps, evictions (reason → count);
        each once there is one."""
        out: dict[str, Any] = {}
        cold = self.cold.get(name)
        if cold is not None:
            out["cold_starts"] = cold.asked
            out["cold_start_waits"] = cold.ready
            out["cold_start_wait_seconds"] = round(cold.wait_sum, 3)
            if cold.last_wait is not None:
                out["cold_start_last_wait_seconds"] = round(cold.last_wait, 3)
        if self.requests.get(name):
            out["gateway_requests"] = {str(k): v for k, v in sorted(self.requests[name].items())}
        group = self._group(name)
        if group and self.swaps.get(group):
            out["group_swaps"] = self.swaps[group]
        if self.evictions.get(name):
            out["evictions"] = dict(sorted(self.evictions[name].items()))
        return out

    def evicted(self, name: str, reason: str) -> None:
        """The gateway's placement stopped the preset's engine to make room (EvictPreset)."""
        self.evictions.setdefault(name, Counter())[reason] += 1
        self.mark(name)

    def announce(self, name: str) -> None:
        """PropertiesChanged(OnDemandState) and (LastRequestAt) when they moved."""
        self._say(name, "OnDemandState", self.state(name))
        self._say(name, "LastRequestAt", self.last_request_at(name))

    def check(self) -> None:
        """Once a second (the publisher's tick): LastRequestAt said when it moved."""
        for name in list(self.last_request):
            self._say(name, "LastRequestAt", self.last_request_at(name))

    def _say(self, name: str, prop: str, value: Any) -> None:
        if (name, prop) not in self.said and value in ("", 0.0):
            self.said[(name, prop)] = value   # what it reads before anything was said
            return
        if self.said.get((name, prop)) == value:
            return
        self.said[(name, prop)] = value
        iface = self.host.exported.get(name)
        if iface is not None:
            iface.emit_properties_changed({prop: value})

    def _group(self, name: str) -> str:
        view = self.host.registry.presets.get(name)
        return view.serve.group if view is not None else ""

    def _members(self, group: str) -> list[str]:
        return sorted(n for n, v in self.host.registry.presets.items() if v.serve.group == group)
