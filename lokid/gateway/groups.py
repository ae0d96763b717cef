"""GPU groups at the gateway: one preset of a ``serve.group`` runs at a time, a swap
never cuts a request (issue 22, item 2), and each swap is worth its cost (issue 28, item 2).

The rule is :func:`lokid.core.serve.swaps.decide` (pure, table-tested); this is its edge. A
request for a preset of a group enters its group's queue (:meth:`Groups.turn`) and goes
on when the rule admits it; from then until its answer is relayed whole (or its client
goes), it counts as in flight for its preset. The rule runs again at every change: a
request arriving, leaving or ending, a member's state or ``RequestsInFlight`` (the
daemon's count of the requests the engine serves, from its log: those straight to its
port too; the gateway takes the larger of it and its own count, since the engine logs a
request a moment after the gateway sends it), and the times the rule gives.

What a swap costs is the load of the preset swapped in, as the daemon measured it and
says in the preset's ``Stats`` (which the gateway follows anyway): its last cold start's
wait from the ask to READY (``cold_start_last_wait_seconds``, what a waiting request
pays), else its engine's last load (``load_seconds``), else an estimate from its
``Memory`` need (:func:`lokid.core.serve.swaps.estimated_cost`), else the rule's default. The
holder's idle time counts from its last request in flight (the gateway's, or the
daemon's count moving to 0) or its READY; each request for a member with nothing of its
own in flight or waiting notes how long after that it came (its clients came back), and
the holder carries the shortest of the last few (the rule's pause is only for clients
that come back within it). Each swap's log line says why it happened,
what the load costs and where the figure comes from, and how many requests waited for
it and how long.

A swap, in this order, each step for a failure it prevents:

- the turn passes to the new preset first: a request for the old one arriving during the
  stop waits for its next turn, never reaches an engine being stopped;
- every other running member is stopped through the daemon (``StopPreset``, as
  ``lokictl stop``; a start of it under way is given up, not counted a failure);
- the new preset's requests are then admitted at once and start it through the
  on-demand start (:mod:`lokid.gateway.ondemand`): one start for all of them, its
  failure their answer. The daemon starts it while the others stop, and its engine
  waits for theirs to be gone (:mod:`lokid.dbus.groupstops`): two models never share
  the GPU's memory, and the new start's planning overlaps the old engines' teardown;
- each stopped member's idle slots are saved first, and restored at its next start before
  its requests are sent (:mod:`lokid.gateway.slots`): a swap keeps the users' caches.

A batch key's request (:attr:`lokid.core.serve.keys.Identity.batch`, issue 46, item 3) never
starts a swap while the holder serves an interactive key's request (in flight or
waiting for its turn): it is left out of the rule until they end, so that neither the
holder's drain nor the wait cap cuts a person's stream for a batch job. Once the holder
has no interactive request, it counts as any other.

Faults: a stop refused answers the new preset's waiting requests with 503 and the
reason, and the old preset keeps the group; an old engine still running when the stop's
own bound is past fails the new start (its engine step says why). A preset
that cannot be started for a request (not ``on_demand``, not ready) never stops another:
its request is answered as without a group.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import time
from collections import Counter, deque
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

from dbus_fast import DBusError

from ..core.serve.swaps import (
    MAX_WAIT,
    NEVER,
    RETURNS_KEPT,
    Decision,
    Holder,
    Waiting,
    cost_of,
    decide,
    estimated_cost,
)
from .ondemand import LOADING, READY, STOPPING, Starter
from .presets import Preset, Presets
from .replies import UNAVAILABLE, GatewayError, public
from .slots import SlotCache
from .staleflight import StaleFigures

log = logging.getLogger("lokid.gateway")

ACTIVE = (READY, LOADING, STOPPING)   # a member in these states holds (or frees) the GPU
CHECK_EVERY = 1.0      # the rule runs at least this often while requests wait (a lost signal)
ASK_AGAIN = 0.25       # seconds before an engine that said it is busy is asked again


@dataclass(eq=False)
class _Waiter:
    key: int
    preset: str
    since: float
    admitted: asyncio.Future[None]
    batch: bool = False   # a batch key's: never the cause of a swap that stops a person's


class Group:
    """One group's queue, its holder and its scheduler (a task, alive while requests wait)."""

    def __init__(self, name: str, presets: Presets, starter: Starter, max_wait: float,
                 slots: SlotCache):
        self.name = name
        self.presets = presets
        self.starter = starter
        self.slots = slots
        self.max_wait = max_wait
        self.waiting: list[_Waiter] = []
        self.own: Counter[str] = Counter()   # the gateway's requests in flight, by preset
        self.interactive: Counter[str] = Counter()   # of them, interactive keys' (issue 46)
        self.active_at: dict[str, float] = {}   # when each last had one in flight (monotonic)
        # per preset, how long its clients took to come back after it went idle, lately
        self.returns: dict[str, deque[float]] = {}
        self.turn = ""          # the preset the group was last given to
        self.since = 0.0        # when (monotonic)
        self.swaps = 0
        self.swapping = False   # a swap's stop under way: nobody is admitted
        self.keys = itertools.count()
        self.task: asyncio.Task[None] | None = None
        self.kick: asyncio.Future[None] | None = None
        # the daemon's RequestsInFlight of the holders, asked of their engines
        self.figures = StaleFigures(slots, f"group {name}",
                                    lambda stale: self._poke() if stale else None, ASK_AGAIN)

    def members(self) -> list[Preset]:
        return [p for p in self.presets.presets.values() if p.group == self.name]

    def holder(self, now: float) -> Holder | None:
        held = self.presets.presets.get(self.turn)
        if held is None or held.group != self.name:
            running = sorted((p for p in self.members() if p.state in ACTIVE),
                             key=lambda p: (p.state != READY, p.name))
            if not running:
                self.turn = ""
                return None
            held = running[0]
            self.turn, self.since = held.name, now
        ready = held.state == READY and bool(held.url)
        theirs = self.figures.counted(held) if ready else 0
        in_flight = max(self.own[held.name], theirs)
        if in_flight > 0:
            self.active_at[held.name] = now
        idle_since = max(self.active_at.get(held.name, NEVER), held.ready_at,
                         held.in_flight_at if ready else NEVER)
        returns = self.returns.get(held.name)
        return Holder(held.name, ready, self.since, in_flight, held.drain,
                      held.ready_at if ready else NEVER, idle_since,
                      min(returns) if returns else None)

    def costs(self) -> dict[str, float]:
        """What a swap to each member costs (seconds): measured, or estimated."""
        return {p.name: swap_cost(p)[0] for p in self.members()}

    # --- the requests' side ------------------------------------------------------------

    async def enter(self, preset: str, batch: bool = False) -> None:
        """Until the rule admits a request for ``preset`` (``batch``: a batch key's);
        GatewayError when its swap failed. A request cancelled meanwhile (its client
        gone) leaves the queue."""
        waiter = _Waiter(next(self.keys), preset, time.monotonic(),
                         asyncio.get_running_loop().create_future(), batch)
        self._returned(preset, waiter.since)
        self.waiting.append(waiter)
        self._step(time.monotonic())   # a ready holder's request goes on without a wait
        if not waiter.admitted.done():
            self._poke()
        try:
            await waiter.admitted
        except BaseException:
            if waiter in self.waiting:
                self.waiting.remove(waiter)
                self._poke()
            elif (waiter.admitted.done() and not waiter.admitted.cancelled()
                  and waiter.admitted.exception() is None):
                self.leave(preset, batch)   # admitted, then cancelled before it went on
            raise

    def _returned(self, preset: str, now: float) -> None:
        """A request for ``preset`` arrived: how long after its last one ended, when none
        of its own is in flight or waiting (its clients came back; lokid.core.serve.swaps)."""
        last = self.active_at.get(preset)
        if last is None or self.own[preset] > 0 or \
                any(w.preset == preset for w in self.waiting):
            return
        self.returns.setdefault(preset, deque(maxlen=RETURNS_KEPT)).append(now - last)

    def leave(self, preset: str, batch: bool = False) -> None:
        """A request admitted for ``preset`` ended."""
        if not batch:
            self.interactive[preset] -= 1
            if self.interactive[preset] <= 0:
                del self.interactive[preset]
        self.own[preset] -= 1
        if self.own[preset] <= 0:
            del self.own[preset]
            self.active_at[preset] = time.monotonic()
        self._poke()

    # --- the scheduler -----------------------------------------------------------------

    def _poke(self) -> None:
        if self.kick is not None and not self.kick.done():
            self.kick.set_result(None)
        if self.waiting and (self.task is None or self.task.done()):
            self.task = asyncio.get_running_loop().create_task(self._run())

    def _step(self, now: float) -> Decision:
        """The rule once (nothing during a swap: its stop comes first); the requests it
        admits go on."""
        if self.swapping:
            return Decision()
        self._drop_strays()
        d = decide(self.holder(now), [Waiting(w.key, w.preset, w.since)
                                      for w in self.waiting if not self._held_back(w)],
                   now, self.max_wait, self.costs())
        for key in d.admit:
            waiter = next(w for w in self.waiting if w.key == key)
            self.waiting.remove(waiter)
            self.own[waiter.preset] += 1
            if not waiter.batch:
                self.interactive[waiter.preset] += 1
            waiter.admitted.set_result(None)
        return d

    def _drop_strays(self) -> None:
        """Answer the requests waiting for a preset that is no longer this group's: broken
        by an edit, removed, or moved out of the group since they came. The rule went on
        swapping to such a preset: each swap stopped the running member (the other model,
        taken down by a broken file) and the request waited out ``max_wait`` (found
        walking the guide under systemd: a typo saved while a request arrived, issue 49)."""
        for w in list(self.waiting):
            preset = self.presets.presets.get(w.preset)
            broken = self.presets.broken.get(w.preset)
            if preset is not None and preset.group == self.name and broken is None:
                continue
            self.waiting.remove(w)
            if broken is not None:
                error = GatewayError(503, f"preset {w.preset!r} is broken: {public(broken)}",
                                     UNAVAILABLE, "model_broken")
            elif preset is None:
                error = GatewayError(404, f"no model {w.preset!r}: its preset was removed "
                                     "while the request waited", code="model_not_found")
            else:
                error = GatewayError(503, f"preset {w.preset!r} left group {self.name} while "
                                     "the request waited; send it again", UNAVAILABLE,
                                     "model_swap_failed")
            log.warning("group %s: a request for %s answered %d: %s", self.name, w.preset,
                        error.status, error.message)
            w.admitted.set_exception(error)

    def _held_back(self, w: _Waiter) -> bool:
        """Whether ``w``, a batch key's request for another preset than the holder, is
        left out of the rule: the holder serves an interactive request, or has one
        waiting for it."""
        return w.batch and w.preset != self.turn and bool(self.turn) and (
            self.interactive[self.turn] > 0 or any(
                not o.batch and o.preset == self.turn for o in self.waiting))

    async def _run(self) -> None:
        try:
            await self._schedule()
        except Exception as e:   # a defect of ours: answered, never a request left hanging
            log.exception("group %s: the scheduler failed", self.name)
            for preset in {w.preset for w in self.waiting}:
                self._refuse(preset, f"the gateway's scheduler of group {self.name} failed: "
                             f"{type(e).__name__}: {e}")

    async def _schedule(self) -> None:
        while self.waiting:
            d = self._step(time.monotonic())
            if d.swap_to:
                self.swapping = True
                try:
                    await self._swap(d)
                finally:
                    self.swapping = False
                # a swap with nothing left to stop awaits nothing: never the whole event
                # loop's (a request for a preset broken meanwhile spun here, and the
                # gateway answered no one: _drop_strays)
                await asyncio.sleep(0)
            elif not d.admit:
                self._ask_engine()
                await self._changed(d.again_at)

    async def _changed(self, until: float | None) -> None:
        """Until something the rule reads changes, ``until`` (monotonic) or CHECK_EVERY."""
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.kick = fut
        members = self.members()
        for m in members:
            m.waiters.add(fut)
        timeout = CHECK_EVERY if until is None else \
            max(0.0, min(CHECK_EVERY, until - time.monotonic()))
        try:
            await asyncio.wait_for(fut, timeout)
        except TimeoutError:
            pass
        finally:
            self.kick = None
            for m in members:
                m.waiters.discard(fut)

    def _ask_engine(self) -> None:
        """The daemon counts the holder's requests from its engine's log, which under
        systemd reaches it through the journal, whose readers journald wakes at most every
        250 ms: a swap waited up to 0.4 s for a request of the gateway's own that had
        ended (issue 31). Where the gateway has none of its own in flight and the daemon
        still counts some, the engine is asked (its /slots); if it serves nothing, that
        figure is stale until it moves. A request straight to the port counts once the
        engine's /slots or the daemon's figure shows it, as before
        (:mod:`lokid.gateway.staleflight`)."""
        held = self.presets.presets.get(self.turn)
        if held is None or self.own[held.name] > 0 or self.figures.is_stale(held) or \
                not any(w.preset != held.name for w in self.waiting) or self.figures.pending():
            return
        self.figures.ask(held)

    async def _swap(self, d: Decision) -> None:
        to = d.swap_to
        previous, previous_since = self.turn, self.since
        self.turn, self.since = to, time.monotonic()
        old = [m for m in self.members() if m.name != to and m.state in ACTIVE]
        if old:
            self._say_swap(d, old)
        for m in old:
            self.starter.cancel(m.name)
            if m.state == STOPPING:
                continue
            if m.state == READY and m.url:   # its users' caches, for its next turn
                await self.slots.save(m.name, m.url)
            try:
                await self.presets.stop(m.name)
            except DBusError as e:
                self.slots.forget(m.name)
                self._refuse(to, f"preset {to!r} waits for {m.name!r} (group {self.name}), "
                             f"which cannot be stopped: {e.text}")
                self.turn, self.since = previous, previous_since
                return
        if old:
            self.swaps += 1

    def _say_swap(self, d: Decision, old: list[Preset]) -> None:
        """The swap's log line: why now, what it costs, who waited for it and how long."""
        to = self.presets.presets.get(d.swap_to)
        cost, source = swap_cost(to) if to is not None else (cost_of(d.swap_to, None), "")
        now = time.monotonic()
        waits = [now - w.since for w in self.waiting if w.preset == d.swap_to]
        names = ", ".join(m.name for m in old)
        in_flight = sum(max(self.own[m.name], m.in_flight) for m in old)
        log.log(logging.WARNING if d.cut else logging.INFO,
                "group %s: swapping %s out for %s%s: %s; loading %s costs %.1f s (%s); "
                "%d requests waited for it, the longest %.1f s", self.name, names,
                d.swap_to, f" with {in_flight} requests in flight" if d.cut else "",
                d.why or "the rule's choice", d.swap_to, cost, source or "not measured yet: "
                "the default", len(waits), max(waits, default=0.0))

    def _refuse(self, preset: str, reason: str) -> None:
        log.warning("group %s: %s", self.name, reason)
        for waiter in [w for w in self.waiting if w.preset == preset]:
            self.waiting.remove(waiter)
            waiter.admitted.set_exception(GatewayError(503, reason, UNAVAILABLE,
                                                       "model_swap_failed"))


def measured(preset: Preset) -> tuple[float | None, str]:
    """The preset's load as the daemon measured it (seconds), and where the figure comes
    from; None before any measurement."""
    if preset.cold_start_wait is not None:
        return preset.cold_start_wait, "measured: its last cold start, from the ask to READY"
    if preset.load_seconds is not None:
        return preset.load_seconds, "measured: its engine's last load"
    return None, ""


def swap_cost(preset: Preset) -> tuple[float, str]:
    """What a swap to ``preset`` costs (seconds), and where the figure comes from: its
    measured load, else an estimate from its memory need, else the rule's default."""
    got, source = measured(preset)
    if got is not None:
        return got, source
    need = preset.need()
    total = 0
    if need is not None:
        fixed, per_gpu, count = need
        total = sum(fixed.values()) + (per_gpu * count if per_gpu > 0 and count > 0 else 0)
    if total <= 0:
        return estimated_cost(0), "not measured yet: the default"
    return estimated_cost(total), (f"not measured yet: estimated from its memory need, "
                                   f"{total / 2**20:.0f} MiB")


class Groups:
    """The gateway's groups, made on a first request for one of their presets."""

    def __init__(self, presets: Presets, starter: Starter, max_wait: float = MAX_WAIT,
                 slots: SlotCache | None = None,
                 placed: Callable[[Preset, bool],
                                  contextlib.AbstractAsyncContextManager[None]] | None = None):
        self.presets = presets
        self.starter = starter
        self.max_wait = max_wait
        self.slots = slots or SlotCache(lambda: None)
        # the room for a start (lokid.gateway.placer's Placer.admitted), after the turn
        self.placed = placed or (lambda _preset, _batch: contextlib.nullcontext())
        self.groups: dict[str, Group] = {}

    @contextlib.asynccontextmanager
    async def turn(self, preset: Preset, batch: bool = False) -> AsyncIterator[str]:
        """The URL of ``preset``'s ready engine once its group is its own (at once without a
        group) and its engine has room; its request counts in flight until the block ends.
        ``batch``: a batch key's request, which starts no swap that would stop an
        interactive one."""
        group = self.group_of(preset)
        if group is None:
            async with self.placed(preset, batch):
                url = await self.starter.url(preset)
                await self.slots.restored(preset.name, url)   # after an eviction's save
                yield url
            return
        await group.enter(preset.name, batch)
        try:
            async with self.placed(preset, batch):
                url = await self.starter.url(preset)
                await self.slots.restored(preset.name, url)   # before its first request
                yield url
        finally:
            group.leave(preset.name, batch)

    def group_of(self, preset: Preset) -> Group | None:
        """The preset's group; None without one, and for a preset a request cannot start
        (not on demand, not ready): that request must not stop another preset."""
        if not preset.group or (not preset.on_demand and preset.state != READY):
            return None
        group = self.groups.get(preset.group)
        if group is None:
            group = self.groups[preset.group] = Group(preset.group, self.presets, self.starter,
                                                      self.max_wait, self.slots)
        return group
