"""The daemon's count of an engine's requests in flight, checked with the engine itself
when it alone holds a decision: the one rule of the placement's cut (issue 46) and the
GPU group's swap (issue 31).

The daemon's ``RequestsInFlight`` is counted from the engine's log, which under systemd
reaches it through the journal (whose readers journald wakes at most every 250 ms): late,
and stale until the engine's next line. A swap waited up to 0.4 s for a request of the
gateway's own that had ended (issue 31); an eviction was counted a cut "with 1 requests
in flight" after the person's stream had ended whole (CI, issue 46). The placer and the
group carried a copy each of the answer; this is it, once.

Rules, each for the failure it prevents:

- only a ready engine with an address whose figure counts a request is asked (its
  ``/slots``, :meth:`lokid.gateway.slots.SlotCache.busy`); where the gateway has
  requests of its own in flight, or nothing waits on the figure, the caller does not ask
  (its count is the gateway's then, or no decision hangs on it);
- one question per figure (the figure is known by when it last moved,
  ``in_flight_at``) and per preset at a time: a rule that runs again before the answer
  does not ask again; a figure answered is asked again only after ``again`` seconds (the
  group's: an engine that served a request straight to its port may be done since), or
  never (the placer's: its cut then goes on by the figure);
- an engine that serves nothing, its figure unmoved meanwhile, makes that figure stale
  until it moves (:meth:`StaleFigures.counted` reads 0); one that serves, or does not say
  (no answer, ``--no-slots``, another shape), leaves the figure as the daemon said it: no
  question ever makes a busy engine look idle.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Callable

from .ondemand import READY
from .presets import Preset
from .slots import SlotCache

log = logging.getLogger("lokid.gateway")


class StaleFigures:
    """The figures that engines, asked, said are stale; ``poke(stale)`` after each answer
    (``stale``: the figure asked about was found so)."""

    def __init__(self, slots: SlotCache, label: str, poke: Callable[[bool], None],
                 again: float = math.inf):
        self.slots = slots
        self.label = label   # who asks, for the log ("placement", "group g")
        self.poke = poke
        self.again = again
        self.stale: dict[str, float] = {}                 # preset → its figure found stale
        self.asked: dict[str, tuple[float, float]] = {}   # preset → (figure, when) answered
        self.asking: dict[str, asyncio.Task[None]] = {}

    def counted(self, p: Preset) -> int:
        """``p``'s ``RequestsInFlight`` as the rules read it: 0 while its engine said it
        serves nothing since that figure last moved."""
        return 0 if self.is_stale(p) else p.in_flight

    def is_stale(self, p: Preset) -> bool:
        return self.stale.get(p.name) == p.in_flight_at

    def pending(self) -> bool:
        """Whether a question to any engine waits for its answer."""
        return any(not task.done() for task in self.asking.values())

    def ask(self, p: Preset) -> bool:
        """Ask ``p``'s engine about its figure now, unless it was answered (within
        ``again``) or cannot be asked: True while an answer is awaited (this question or
        one before it), False when there is none to wait for."""
        if p.state != READY or not p.url or p.in_flight <= 0:
            return False
        asked = self.asked.get(p.name)
        if asked is not None and asked[0] == p.in_flight_at and \
                time.monotonic() - asked[1] < self.again:
            return False
        task = self.asking.get(p.name)
        if task is None or task.done():
            self.asking[p.name] = asyncio.get_running_loop().create_task(
                self._ask(p, p.in_flight_at, time.monotonic()))
        return True

    async def _ask(self, p: Preset, figure_at: float, at: float) -> None:
        busy = await self.slots.busy(p.name, p.url)
        stale = busy is False and p.in_flight_at == figure_at and p.in_flight > 0
        if stale:
            log.debug("%s: %s serves nothing, its RequestsInFlight %d is stale",
                      self.label, p.name, p.in_flight)
            self.stale[p.name] = figure_at
        self.asked[p.name] = (figure_at, at)
        self.poke(stale)
