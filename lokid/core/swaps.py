"""Which preset of a GPU group runs next, and when the swap may happen (issue 22, item 2).

A group (``serve.group``) runs at most one preset at a time: its *holder*. Requests for
the holder go to it; requests for another preset of the group wait, and the holder is
swapped out for them. The rules, each against a failure seen in other tools:

- a swap never cuts a request: the holder is stopped only once it has no request in
  flight (the gateway's and those straight to its port alike), or once its ``drain``
  has passed since another preset's request began waiting in its turn (llama.cpp's
  router aborts the requests in flight on a swap, its issue #22447);
- waiting requests are grouped by preset, and the holder's own requests go first: six
  requests A B A A C B with A running are served A A A, then B B, then C (2 swaps),
  where a FIFO order swaps back and forth 4 times (llama-swap's issue #612);
- no preset starves: the holder takes new requests of its own ahead of the others for
  at most :data:`MAX_WAIT` (or its ``drain``, if shorter) once another preset's request
  waits; then its new requests wait their turn too;
- the next preset is the one whose request has waited longest;
- a start nobody waits for any more is given up when another preset's request waits
  (llama-swap's issue #727): it would hold the GPU for no one. Without another request
  waiting, the start goes on: the next client will want it;
- a start is never cut for its drain: its requests wait for it (a start is bounded by
  the gateway's own start timeout).

So a request waits, for each turn ahead of it, at most the holder's drain and a start.

:func:`decide` is the rule, pure (times are the caller's monotonic clock); the gateway's
:mod:`lokid.gateway.groups` runs it at every change (a request arriving, leaving or
ending, an engine's state, its ``RequestsInFlight``) and does what it says.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

# Seconds the holder keeps taking its own new requests ahead of another preset's waiting
# ones: long enough to batch a burst, short enough that a chat of the other model is not
# held up by a busy one for more than this plus the holder's requests already in flight.
MAX_WAIT = 30.0


@dataclass(frozen=True)
class Waiting:
    """A request waiting for its preset's turn."""

    key: int          # the caller's handle
    preset: str
    since: float      # when it began waiting


@dataclass(frozen=True)
class Holder:
    """The preset of the group that runs, or starts, or was the last one given the turn."""

    preset: str
    ready: bool       # serving; False while its start is under way, or stopped
    since: float      # when it got its turn
    in_flight: int    # its requests in flight: the gateway's and those straight to its port
    drain: float      # its serve.drain (seconds)


@dataclass(frozen=True)
class Decision:
    admit: tuple[int, ...] = ()      # waiting requests that go to the holder now
    swap_to: str = ""                # stop the holder (every other running one), start this
    cut: bool = False                # the swap does not wait for the holder's requests
    again_at: float | None = None    # decide again then, if nothing changed before


def _first(waiting: Iterable[Waiting]) -> Waiting:
    return min(waiting, key=lambda w: (w.since, w.key))


def decide(holder: Holder | None, waiting: Sequence[Waiting], now: float,
           max_wait: float = MAX_WAIT) -> Decision:
    """What the group does now, given its holder (None: no preset of it has run yet) and
    the requests waiting."""
    if holder is None:
        return Decision(swap_to=_first(waiting).preset) if waiting else Decision()
    mine = tuple(w.key for w in sorted(waiting, key=lambda w: (w.since, w.key))
                 if w.preset == holder.preset)
    others = [w for w in waiting if w.preset != holder.preset]
    if not others:
        return Decision(admit=mine)
    first = _first(others)
    # the others' wait counts against this turn from its beginning only: the next
    # holder's own requests, waiting since before, are its turn's reason
    opened = max(first.since, holder.since)
    closes = opened + min(max_wait, holder.drain)
    cuts = opened + holder.drain
    if not holder.ready:
        if mine or holder.in_flight:
            return Decision(admit=mine)
        return Decision(swap_to=first.preset)
    if mine and now < closes:
        return Decision(admit=mine, again_at=closes)
    if holder.in_flight <= 0:
        return Decision(swap_to=first.preset)
    if now >= cuts:
        return Decision(swap_to=first.preset, cut=True)
    return Decision(again_at=cuts)


def changes(running: str, order: Iterable[str]) -> int:
    """The swaps a serving order costs, from ``running`` ("" for none running): each
    change of preset from one request to the next is one."""
    count, current = 0, running
    for preset in order:
        if preset != current:
            count += bool(current)
            current = preset
    return count
