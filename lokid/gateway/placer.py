"""Engines placed by the memory they really use (issue 29, item 4): the gateway's edge of
:func:`lokid.core.place.policy.decide`.

A request for an on-demand preset whose engine is not running asks for room first
(:meth:`Placer.admitted`). What the rule reads comes from the daemon, by its signals:
each device's room (the manager's ``Devices``), each preset's need (its ``Memory``: the
footprint measured at its last ready load of that configuration, else the GGUF
estimate), ``Keep``, its state, ``RequestsInFlight`` and its measured load (before one was
measured, an estimate from its need, as a GPU group's swap: :func:`.groups.swap_cost`);
and from the gateway itself: the requests it relays (in flight, the last one, the
interval between them), the requests that wait. The rule runs at every change and at
the time it gives.

What it says is done here, each step for a failure it prevents:

- **start**: the waiting requests of the preset go on, and its start (one for all of
  them, :mod:`lokid.gateway.ondemand`) counts as holding its need from that moment,
  before the engine's first state arrives: two starts never take the same room;
- **evict**: the idle engine is stopped through the daemon (``EvictPreset``: a stop, as
  ``lokictl stop``, that the daemon logs with the why and counts); only an on-demand
  preset's, which its next request starts again (one started by hand and not on demand
  counts as ``keep``); its slots saved first where its engine has a place for them (a
  preset in a GPU group); its log line says what it frees, what reloading it costs and
  for whom. An engine being stopped holds its memory until it is inactive: the start it
  makes room for waits for that, never starts into memory still held;
- **hold**: the requests wait, bounded by ``[placement] max_wait`` (then 503
  ``model_waits_for_memory`` with the hold's figures: "needs 18.2 GiB on GPU0; GPU0 has
  6.1 GiB free; …"); an engine the plan *closes* takes no new request until it drained
  (its new requests wait with the others), so a busy engine in the way cannot be kept
  busy forever;
- **refuse**: what can never fit on this host is answered at once (the daemon's
  ``StartForRequest`` refuses it too);
- **a batch key's requests** (:attr:`lokid.core.serve.keys.Identity.batch`, issue 46) never
  close or cut an engine serving an interactive key's request: where the plan for them
  would, they are left out of the rule until those requests end (a batch job must not
  cut a person's stream after its engine's drain); their wait is still bounded by
  ``max_wait``;
- **a cut** (an engine stopped with requests in flight once its drain is over) where
  only the daemon's count says it is busy waits for the engine's own ``/slots``: that
  count comes from the engine's log through the journal, late, and a stream that had
  ended whole was counted cut.

Where the room is unknown (no ``Devices`` yet, an older daemon) or a preset's need is
(no plan, an unreadable header), nothing waits here: the start goes on as before this
rule existed, and the daemon's own refusal still holds. ``[placement] enabled = false``
turns the rule off. Groups stay: a group's swap runs first (its turn), then the
placement of the preset it swapped in.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import Counter, deque
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

from dbus_fast import DBusError

from ..core.config.external import EXTERNAL
from ..core.place.policy import (
    Device,
    Need,
    Plan,
    Resident,
    Waiting,
    decide,
    fits_now,
    placeable,
)
from ..core.place.settings import PlacementConfig
from ..core.serve.swaps import MAX_WAIT as CLOSE_AFTER
from ..core.serve.swaps import NEVER
from .groups import swap_cost
from .ondemand import LOADING, READY, STOPPING
from .presets import Preset, Presets
from .replicaroom import replica_residents
from .replies import UNAVAILABLE, GatewayError
from .slots import SlotCache
from .staleflight import StaleFigures

log = logging.getLogger("lokid.gateway")

CHECK_EVERY = 1.0      # the rule runs at least this often while requests wait
REPORT_EVERY = 10.0    # seconds between two reports of the same waits to the daemon
REPORT_MIN = 1.0       # seconds between two reports of waits that changed
GRANT_HOLD = 30.0      # seconds a granted start holds its need before its engine is seen
STOP_TIMEOUT = 120.0   # seconds an eviction's stop may take before it counts as not done
GAPS = 8               # the requests whose intervals make a preset's clients' pace
ACTIVE = (READY, LOADING, STOPPING)


@dataclass(eq=False)
class _Waiter:
    preset: str
    since: float
    admitted: asyncio.Future[None]
    batch: bool = False   # a batch key's request (issue 46)


def devices_of(rows: list[dict[str, object]]) -> list[Device]:
    """The manager's Devices rows as the rule's devices (a damaged row is left out)."""
    out = []
    for r in rows:
        name, total = r.get("device"), r.get("total")
        if not isinstance(name, str) or not isinstance(total, int) or total < 0:
            continue
        reserve, others = r.get("reserve", 0), r.get("others", 0)
        out.append(Device(name, total, reserve if isinstance(reserve, int) else 0,
                          others if isinstance(others, int) else 0))
    return out


def need_of(preset: Preset) -> Need | None:
    """The preset's need from its Memory; None when it is unknown. Its cost: the measured
    load, else the groups' estimate from that need (:func:`~.groups.swap_cost`). Its part
    on devices whose room the daemon could not read (``room_unknown``) is left out: a
    start waits for no room that nobody knows (issue 44, item 10)."""
    need = preset.need()
    if need is None:
        return None
    unknown = preset.memory.get("room_unknown")
    unknown = {str(k): str(v) for k, v in unknown.items()} if isinstance(unknown, dict) else {}
    return placeable(Need(preset.name, *need, swap_cost(preset)[0]), unknown)


def held_of(preset: Preset, need: Need | None, granted_on: tuple[str, ...] = ()
            ) -> dict[str, int]:
    """What the preset's engine holds where it runs: the devices its start chose (the
    daemon's ``held``, for ``gpus = "auto"``), else its need's named devices and, until
    the daemon says where its start went, ``per_gpu`` on the GPUs the rule granted."""
    held = preset.memory.get("held")
    if isinstance(held, dict) and held:
        return {str(d): int(n) for d, n in held.items() if isinstance(n, int) and n >= 0}
    if need is None:
        return {}
    return {**need.fixed, **{g: need.per_gpu for g in granted_on if need.count}}


def _requests(n: int) -> str:
    return "1 request" if n == 1 else f"{n} requests"


class Placer:
    def __init__(self, presets: Presets, settings: PlacementConfig, slots: SlotCache,
                 clock: Callable[[], float] = time.monotonic):
        self.presets = presets
        self.settings = settings
        self.slots = slots
        self.clock = clock
        self.waiting: list[_Waiter] = []
        self.own: Counter[str] = Counter()          # the gateway's requests in flight
        self.interactive: Counter[str] = Counter()  # of them, interactive keys' (issue 46)
        self.last_used: dict[str, float] = {}       # when each last had a request
        self.idle_since: dict[str, float] = {}      # when its last request ended
        self.arrivals: dict[str, deque[float]] = {}
        self.granted: dict[str, float] = {}         # starts admitted, not yet seen running
        self.granted_on: dict[str, tuple[str, ...]] = {}   # the GPUs the rule chose for it
        self.granted_moves: dict[str, int] = {}     # its Preset.moves at the grant
        # stops asked, not yet seen done: preset → (when, its ready_at then)
        self.evicting: dict[str, tuple[float, float]] = {}
        self.closing: dict[str, float] = {}         # preset → closed since (no new request)
        self.why: dict[str, str] = {}               # preset → why its requests wait
        self.evictions: Counter[tuple[str, str]] = Counter()   # (preset, reason)
        self.task: asyncio.Task[None] | None = None
        self.reported: dict[str, str] = {}          # the waits last told to the daemon
        self.reported_at = float("-inf")
        self.sending: set[asyncio.Task[None]] = set()
        self.kick: asyncio.Future[None] | None = None
        # the RequestsInFlight figures its engines were asked about before a cut, once each
        self.figures = StaleFigures(slots, "placement", lambda _stale: self._poke())

    # --- the requests' side ------------------------------------------------------------

    @contextlib.asynccontextmanager
    async def admitted(self, preset: Preset, batch: bool = False) -> AsyncIterator[None]:
        """Until there is room for ``preset``'s engine (at once when it runs); its request
        counts in flight until the block ends. GatewayError 503 when it cannot have room
        in time, or ever. ``batch``: a batch key's request."""
        if self._wants_room(preset):
            await self._wait(preset, batch)
        name = preset.name
        now = self.clock()
        self.own[name] += 1
        if not batch:
            self.interactive[name] += 1
        self.last_used[name] = now
        self.arrivals.setdefault(name, deque(maxlen=GAPS + 1)).append(now)
        try:
            yield
        finally:
            if not batch:
                self.interactive[name] -= 1
                if self.interactive[name] <= 0:
                    del self.interactive[name]
            self.own[name] -= 1
            if self.own[name] <= 0:
                del self.own[name]
                self.idle_since[name] = self.clock()
            self._poke()

    def _wants_room(self, preset: Preset) -> bool:
        if not self.settings.enabled or preset.kind == EXTERNAL or not preset.on_demand:
            return False
        if preset.name in self.evicting:
            # being stopped: a request sent now would reach its port, and systemd's socket
            # would start the engine again into the room just made (seen in the systemd
            # walk: evicted, restarted at once, and the preset it made room for waited)
            return True
        if preset.name in self.closing and preset.state == READY:
            return True   # drained for a plan: its new requests wait their turn
        self._settle(self.clock())   # a grant whose start came and went is no grant
        if preset.state in (READY, LOADING) or preset.name in self.granted:
            return False
        return bool(devices_of(self.presets.devices)) and need_of(preset) is not None

    async def _wait(self, preset: Preset, batch: bool = False) -> None:
        waiter = _Waiter(preset.name, self.clock(), asyncio.get_running_loop().create_future(),
                         batch)
        self.waiting.append(waiter)
        self._step(self.clock())   # room now: no wait at all
        if not waiter.admitted.done():
            self._poke()
        try:
            await asyncio.wait_for(asyncio.shield(waiter.admitted), self.settings.max_wait)
        except TimeoutError:
            raise GatewayError(
                503, f"{self.why.get(preset.name) or 'no room for preset ' + repr(preset.name)}"
                f"; its request waited {self.settings.max_wait:.0f} s ([placement] max_wait)",
                UNAVAILABLE, "model_waits_for_memory") from None
        finally:
            if waiter in self.waiting:
                self.waiting.remove(waiter)
                self._poke()

    def fits(self, preset: Preset, residents: list[Resident] | None = None) -> bool | None:
        """Whether a start of ``preset`` fits now without evicting anything (True for
        one that runs); None where the placement is off or its figures are unknown.
        GET /v1/models says it, for the peers' routing (issue 30)."""
        if preset.state in ACTIVE:
            return True
        devices = devices_of(self.presets.devices)
        need = need_of(preset)
        if not self.settings.enabled or not devices or need is None:
            return None
        return fits_now(need, devices, residents if residents is not None
                        else self.residents(self.clock()))

    # --- the rule ----------------------------------------------------------------------

    def gap(self, name: str) -> float | None:
        """The mean interval between the preset's recent requests (None: fewer than 3)."""
        times = self.arrivals.get(name)
        if times is None or len(times) < 3:
            return None
        return (times[-1] - times[0]) / (len(times) - 1)

    def residents(self, now: float) -> list[Resident]:
        out = []
        for p in self.presets.presets.values():
            if p.kind == EXTERNAL:
                continue
            granted = p.name in self.granted
            if p.state not in ACTIVE and not granted:
                continue
            need = need_of(p)
            ready = p.state == READY
            theirs = self.figures.counted(p) if ready else 0
            in_flight = max(self.own[p.name], theirs)
            idle = max(self.idle_since.get(p.name, NEVER), p.ready_at,
                       p.in_flight_at if ready and p.in_flight == 0 else NEVER)
            out.append(Resident(
                p.name, held_of(p, need, self.granted_on.get(p.name, ())), in_flight,
                ready_since=p.ready_at if ready else NEVER,
                idle_since=idle if in_flight == 0 else now,
                last_used=self.last_used.get(p.name, p.ready_at if ready else NEVER),
                # one not on demand would not come back by itself: as kept
                cost=swap_cost(p)[0], gap=self.gap(p.name), drain=p.drain,
                keep=p.keep or not p.on_demand,
                starting=not ready or p.name in self.evicting,
                stopping=p.name in self.evicting or p.state == STOPPING,
                closing=p.name in self.closing,
                closed_since=self.closing.get(p.name, NEVER)))
            out.extend(replica_residents(p))   # its replicas' room is taken too
        return out

    def _step(self, now: float) -> float | None:
        """The rule once, and what it says done (the evictions started); when to run it
        again by time alone."""
        self._settle(now)
        devices = devices_of(self.presets.devices)
        by_preset: dict[str, list[_Waiter]] = {}
        for w in self.waiting:
            if not w.admitted.done():
                by_preset.setdefault(w.preset, []).append(w)
        waiting = []
        for name, ws in by_preset.items():
            preset = self.presets.presets.get(name)
            need = need_of(preset) if preset is not None else None
            if preset is None or need is None or not devices or not self.settings.enabled:
                self._admit(ws)   # nothing to place by: as before the rule
                continue
            if preset.state == READY and name not in self.closing \
                    and name not in self.evicting:
                self._admit(ws)   # it runs, and takes requests again
                continue
            waiting.append(Waiting(need, min(w.since for w in ws), len(ws),
                                   sum(now - w.since for w in ws)))
        plan = decide(devices, self.residents(now), waiting, now, max_wait=CLOSE_AFTER)
        spared = self._spared(plan, by_preset)
        if spared:   # a batch key's requests close no engine serving a person's
            waiting = [w for w in waiting if w.need.preset not in spared]
            plan = decide(devices, self.residents(now), waiting, now, max_wait=CLOSE_AFTER)
            for name, why in spared.items():
                self.why[name] = why
        for start in plan.starts:
            self.granted[start.preset] = now
            self.granted_on[start.preset] = start.devices
            p = self.presets.presets.get(start.preset)
            self.granted_moves[start.preset] = p.moves if p is not None else 0
            self.why.pop(start.preset, None)
            ws = by_preset.get(start.preset, [])
            waited = max((now - w.since for w in ws), default=0.0)
            if waited >= 1.0:
                log.info("placement: starting %s after %.1f s: %s", start.preset, waited,
                         start.why)
            self._admit(ws)
        for hold in plan.holds:
            self.why[hold.preset] = hold.why
        closing = set(plan.closing)
        for name in closing - set(self.closing):
            self.closing[name] = now
            log.info("placement: %s takes no new request until it drained (%s)", name,
                     self.why.get(next((h.preset for h in plan.holds if name in h.closing),
                                       ""), ""))
        for name in set(self.closing) - closing:
            del self.closing[name]
        for refusal in plan.refusals:
            self._refuse(refusal.preset, refusal.why)
        self._report({w.need.preset: f"{_requests(w.count)} waiting {now - w.since:.0f} s: "
                      f"{self.why[w.need.preset]}" for w in waiting
                      if w.need.preset in self.why}, now)
        for evict in plan.evictions:
            if evict.preset not in self.evicting:
                p = self.presets.presets.get(evict.preset)
                if evict.cut and p is not None and self._ask_first(p):
                    continue   # busy by the daemon's figure alone: its engine says first
                self.evicting[evict.preset] = (now, p.ready_at if p is not None else NEVER)
                self.evictions[(evict.preset, "cut" if evict.cut else "room")] += 1
                asyncio.get_running_loop().create_task(self._evict(evict.preset, evict.why,
                                                                   evict.cut))
        return plan.again_at

    def _spared(self, plan: Plan, by_preset: dict[str, list[_Waiter]]) -> dict[str, str]:
        """The presets, waited for by batch keys' requests only, whose plan closes or
        evicts an engine serving an interactive request; why they wait."""
        batch = {n for n, ws in by_preset.items() if ws and all(w.batch for w in ws)}
        spared: dict[str, str] = {}
        for e in plan.evictions:
            if e.to_make_room_for in batch and self.interactive[e.preset] > 0:
                spared[e.to_make_room_for] = e.preset
        for h in plan.holds:
            busy = [c for c in h.closing if self.interactive[c] > 0]
            if h.preset in batch and busy:
                spared[h.preset] = busy[0]
        return {name: f"a batch key's requests wait: {busy} serves interactive requests, "
                "and is not stopped for them" for name, busy in spared.items()}

    def _ask_first(self, p: Preset) -> bool:
        """Whether a cut of ``p`` waits for its engine's word. Its requests in flight are
        the daemon's ``RequestsInFlight`` alone (none of the gateway's own): a figure read
        from the engine's log, which reaches the daemon through the journal late. A
        person's stream that had ended whole was counted cut, its log line saying "1
        requests in flight" (CI, issue 46's batch test). The engine's ``/slots`` is asked
        once per figure; if it serves nothing, the figure is stale until it moves, and the
        rule runs again (the eviction is then for room). If it serves, or does not say,
        the cut goes on (:mod:`lokid.gateway.staleflight`)."""
        return self.own[p.name] <= 0 and self.figures.ask(p)

    def _settle(self, now: float) -> None:
        """Forget granted starts once their engine is seen (or never was), and evictions
        once their engine stopped."""
        for name, at in list(self.granted.items()):
            p = self.presets.presets.get(name)
            # seen running, or its state moved since (a start that came and failed
            # between two steps of the rule), or never seen at all
            if p is None or p.state in ACTIVE or now - at > GRANT_HOLD \
                    or p.moves != self.granted_moves.get(name, p.moves):
                del self.granted[name]
        for name, (asked, ready_at) in list(self.evicting.items()):
            p = self.presets.presets.get(name)
            # gone; or ready again since (started anew before its stop was seen: a
            # client straight to its port); or a stop that never came
            if p is None or p.state not in ACTIVE or (p.state == READY and
                                                      p.ready_at != ready_at):
                del self.evicting[name]
                self.closing.pop(name, None)
            elif now - asked > STOP_TIMEOUT:
                del self.evicting[name]
                self.closing.pop(name, None)
                log.warning("placement: %s was asked to stop %.0f s ago and still runs (%s): "
                            "counted as running again", name, now - asked, p.state)

    def _admit(self, ws: list[_Waiter]) -> None:
        for w in ws:
            if not w.admitted.done():
                w.admitted.set_result(None)
            if w in self.waiting:
                self.waiting.remove(w)

    def _refuse(self, name: str, why: str) -> None:
        for w in [w for w in self.waiting if w.preset == name]:
            self.waiting.remove(w)
            if not w.admitted.done():
                w.admitted.set_exception(GatewayError(503, why, UNAVAILABLE,
                                                      "model_does_not_fit"))

    async def _evict(self, name: str, why: str, cut: bool) -> None:
        log.log(logging.WARNING if cut else logging.INFO, "placement: %s", why)
        p = self.presets.presets.get(name)
        try:
            if p is not None and p.group and p.state == READY and p.url:
                await self.slots.save(name, p.url)   # its users' caches, for its next start
            await self.presets.evict(name, "cut" if cut else "room", why)
        except (DBusError, OSError, ValueError) as e:   # refused, or the bus gone
            self.slots.forget(name)
            self.evicting.pop(name, None)
            log.warning("placement: %s could not be stopped to make room: %s", name,
                        e.text if isinstance(e, DBusError) else f"{type(e).__name__}: {e}")
        self._poke()

    # --- the scheduler -----------------------------------------------------------------

    def _poke(self) -> None:
        if self.kick is not None and not self.kick.done():
            self.kick.set_result(None)
        if self.waiting and (self.task is None or self.task.done()):
            self.task = asyncio.get_running_loop().create_task(self._run())

    async def _run(self) -> None:
        try:
            while self.waiting:
                again = self._step(self.clock())
                if not self.waiting:
                    break
                await self._changed(again)
            self._report({}, self.clock())   # nothing waits any more
        except Exception as e:   # a defect of ours: answered, never a request left hanging
            log.exception("placement: the scheduler failed")
            for name in {w.preset for w in self.waiting}:
                self._refuse(name, f"the gateway's placement failed: {type(e).__name__}: {e}")

    def _report(self, waits: dict[str, str], now: float) -> None:
        """Tell the daemon why requests wait (lokictl top, the Waits property): when it
        changed, at most once a second (the waits' ages move each second), and again
        every REPORT_EVERY while they wait (the daemon forgets a word not repeated); that
        nothing waits any more, at once. A report that fails is logged, never in the way."""
        since = now - self.reported_at
        if waits == self.reported and (not waits or since < REPORT_EVERY) \
                or (waits and self.reported and since < REPORT_MIN):
            return
        self.reported, self.reported_at = dict(waits), now

        async def send() -> None:
            try:
                await self.presets.report_waits(waits)
            except (DBusError, OSError, ValueError) as e:
                log.info("placement: the daemon was not told why requests wait: %s",
                         e.text if isinstance(e, DBusError) else f"{type(e).__name__}: {e}")

        task = asyncio.get_running_loop().create_task(send())
        self.sending.add(task)   # held until done: the loop keeps only a weak reference
        task.add_done_callback(self.sending.discard)

    async def _changed(self, until: float | None) -> None:
        """Until a preset or the devices change, a request ends, or ``until``."""
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.kick = fut
        timeout = CHECK_EVERY if until is None else \
            max(0.0, min(CHECK_EVERY, until - self.clock()))
        self.presets.watchers.add(fut)
        try:
            await asyncio.wait_for(asyncio.shield(fut), timeout)
        except TimeoutError:
            pass
        finally:
            self.kick = None
            self.presets.watchers.discard(fut)
