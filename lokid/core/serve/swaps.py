"""Which preset of a GPU group runs next, and when the swap may happen (issues 22 and 28).

A group (``serve.group``) runs at most one preset at a time: its *holder*. Requests for
the holder go to it; requests for another preset of the group wait, and the holder is
swapped out for them. The rules, each against a failure seen in other tools or in ours:

- a swap never cuts a request: the holder is stopped only once it has no request in
  flight (the gateway's and those straight to its port alike), or once its ``drain``
  has passed since another preset's request began waiting in its turn (llama.cpp's
  router aborts the requests in flight on a swap, its issue #22447);
- waiting requests are grouped by preset, and the holder's own requests go first: six
  requests A B A A C B with A running are served A A A, then B B, then C (2 swaps),
  where a FIFO order swaps back and forth 4 times (llama-swap's issue #612);
- a swap is worth its cost: it costs the load of the preset swapped in (its measured
  cold start, the caller's ``costs``; before one was measured, :func:`estimated_cost`
  of its memory need, or :data:`DEFAULT_COST` when that is unknown too), so
  the holder keeps the group for at least that long after its READY, unless the
  request the swap is for has already waited longer than that (it paid the cost in
  waiting). So a swap costs at most as much GPU time as the holder had since its READY
  or its request waited (issue 28: 8 clients over two presets made 72 to 127 swaps in
  3 minutes, three within 0.9 s). The hold is for the holder's clients: an idle holder
  whose clients came back, each of the last :data:`RETURNS_KEPT` times, later than the
  hold would end has none (issue 31: one client going from one preset to the other
  waited for a turn nobody used, ~100 ms of a 320 ms swap under systemd);
- a pause between a client's requests is no end of its holder's turn: the holder is
  idle only once it has had no request in flight for :data:`PAUSE`, or for the swap's
  cost if shorter (waiting for its clients to come back is worth no more than the swap
  costs: with a fast load and every client waiting for the other preset, a second of
  pause cost two thirds of the requests served). A client at work sends its next
  request a few milliseconds after its answer, and the holder used to be swapped out in
  that gap (issue 28 again). The pause is for clients that come back: a holder whose
  clients took longer than the pause to come back each of the last :data:`RETURNS_KEPT`
  times it went idle (the caller's ``back``, the shortest of them) has none taken, since
  waiting for them only delays the swap (issue 31: 40 ms of a 117 ms swap);
- no preset starves: the holder takes new requests of its own ahead of the others for
  at most :data:`MAX_WAIT` (or its ``drain``, if shorter) once another preset's request
  waits; then its new requests wait their turn too;
- the next preset is the one whose request has waited longest;
- a start nobody waits for any more is given up when another preset's request waits
  (llama-swap's issue #727): it would hold the GPU for no one. Without another request
  waiting, the start goes on: the next client will want it;
- a start is never cut for its drain: its requests wait for it (a start is bounded by
  the gateway's own start timeout).

So a request waits, for each turn ahead of it, at most the longer of the holder's drain
and the cost of its own swap, and a start.

:func:`decide` is the rule, pure (times are the caller's monotonic clock); the gateway's
:mod:`lokid.gateway.groups` runs it at every change (a request arriving, leaving or
ending, an engine's state, its ``RequestsInFlight``) and does what it says, logging each
swap with :attr:`Decision.why` and what it costs.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from .tables import span_text

# Seconds the holder keeps taking its own new requests ahead of another preset's waiting
# ones: long enough to batch a burst, short enough that a chat of the other model is not
# held up by a busy one for more than this plus the holder's requests already in flight.
MAX_WAIT = 30.0
# Seconds a swap is taken to cost before the load of the preset swapped in was measured:
# a model of a few GB loads in a few seconds from the page cache and in tens from a disk
# on a GPU server. Too short, and the first swaps to a big model thrash; too long, and
# the first swap to a small one waits for nothing; the first start measures it.
DEFAULT_COST = 10.0
# Bytes a second a load is taken to move before it was measured, for a preset whose memory
# need is known: a model read from the page cache or a fast disk and copied to the GPU (a
# 3.4 GB model loaded in 0.5 s on an H200 from the page cache: 6.7 GB/s; a cold disk is
# slower). With :data:`DEFAULT_COST` as the bound, only the first swaps to a model of less
# than ~21 GB cost less than they did: a small model's first swap no longer waits 10 s
# (issue 31: the first swap of every fresh install did).
LOAD_RATE = 2 * 1024**3
# Seconds without a request in flight after which the holder is idle: longer than the
# gap between a client's answer and its next request (milliseconds for a program, an
# agent's next turn), shorter than a person's.
PAUSE = 1.0
# How many of a holder's last returns (from idle to its next request) tell whether its
# clients come back within a pause.
RETURNS_KEPT = 8
NEVER = float("-inf")


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
    ready_since: float = NEVER   # when it became ready (NEVER: before the caller knew)
    # when its last request in flight ended, or when it became ready if that is later
    # (read when in_flight is 0)
    idle_since: float = NEVER
    # the shortest time its clients took to send a request after it went idle, over its
    # last RETURNS_KEPT times (None: not seen yet, and the pause is taken)
    back: float | None = None


@dataclass(frozen=True)
class Decision:
    admit: tuple[int, ...] = ()      # waiting requests that go to the holder now
    swap_to: str = ""                # stop the holder (every other running one), start this
    cut: bool = False                # the swap does not wait for the holder's requests
    again_at: float | None = None    # decide again then, if nothing changed before
    why: str = field(default="", compare=False)   # a swap's reason, in words, for its log


def _first(waiting: Iterable[Waiting]) -> Waiting:
    return min(waiting, key=lambda w: (w.since, w.key))


def estimated_cost(need_bytes: int) -> float:
    """What a swap to a preset never loaded is taken to cost: its memory need (weights, KV
    cache and buffers, on every device) moved at :data:`LOAD_RATE`, at least :data:`PAUSE`
    and at most :data:`DEFAULT_COST`; :data:`DEFAULT_COST` when the need is unknown (0)."""
    if need_bytes <= 0:
        return DEFAULT_COST
    return min(DEFAULT_COST, max(PAUSE, need_bytes / LOAD_RATE))


def cost_of(preset: str, costs: Mapping[str, float] | None) -> float:
    """The seconds a swap to ``preset`` costs: the caller's figure (its measured load, or
    :func:`estimated_cost` before one), else DEFAULT_COST."""
    got = (costs or {}).get(preset)
    return DEFAULT_COST if got is None or got < 0 else got


def decide(holder: Holder | None, waiting: Sequence[Waiting], now: float,
           max_wait: float = MAX_WAIT, costs: Mapping[str, float] | None = None,
           pause: float = PAUSE) -> Decision:
    """What the group does now, given its holder (None: no preset of it has run yet), the
    requests waiting and what a swap to each preset costs (seconds, by preset:
    :func:`cost_of`). With every cost and ``pause`` 0, this is issue 22's rule."""
    if holder is None:
        if not waiting:
            return Decision()
        first = _first(waiting)
        return Decision(swap_to=first.preset, why="no preset of the group runs, and "
                        f"{first.preset}'s request waited longest")
    mine = tuple(w.key for w in sorted(waiting, key=lambda w: (w.since, w.key))
                 if w.preset == holder.preset)
    others = [w for w in waiting if w.preset != holder.preset]
    if not others:
        return Decision(admit=mine)
    first = _first(others)
    chosen = f"{first.preset}'s request waited longest ({now - first.since:.1f} s)"
    # the others' wait counts against this turn from its beginning only: the next
    # holder's own requests, waiting since before, are its turn's reason
    opened = max(first.since, holder.since)
    closes = opened + min(max_wait, holder.drain)
    cuts = opened + holder.drain
    if not holder.ready:
        if mine or holder.in_flight:
            return Decision(admit=mine)
        return Decision(swap_to=first.preset,
                        why=f"{holder.preset} is starting for no request; {chosen}")
    # the swap's cost: no swap within it of the holder's READY, unless the request it is
    # for has waited longer than it already
    cost = cost_of(first.preset, costs)
    worth = min(holder.ready_since, first.since) + cost
    # ...unless the hold would serve nobody: the holder idle, and its clients, each of
    # the last times, came back later than the hold would end
    gone = not mine and holder.in_flight <= 0 and holder.back is not None and \
        holder.idle_since + holder.back > worth
    if now < worth and not gone:
        return Decision(admit=mine, again_at=worth)
    if mine and now < closes:
        return Decision(admit=mine, again_at=closes)
    if holder.in_flight <= 0:
        pause = min(pause, cost)
        if holder.back is not None and holder.back > pause:
            since = max(holder.idle_since, holder.ready_since)
            idle = f"for {now - since:.1f} s" if since > NEVER else "since the gateway started"
            return Decision(swap_to=first.preset, why=f"{holder.preset} has had no request "
                            f"{idle}, and its clients took {holder.back:.1f} s at the soonest "
                            f"to come back (its last {RETURNS_KEPT} times idle): no pause"
                            f"{', no hold for the swap' if now < worth else ''}; {chosen}")
        if now >= closes:
            return Decision(swap_to=first.preset, why=f"{holder.preset}'s turn is over (its "
                            f"head start of {span_text(min(max_wait, holder.drain))}) and it has "
                            f"drained; {chosen}")
        if now >= holder.idle_since + pause:
            idle = "since it became ready" if holder.idle_since == holder.ready_since \
                else f"for {now - holder.idle_since:.1f} s"
            return Decision(swap_to=first.preset, why=f"{holder.preset} has had no request "
                            f"{idle}; {chosen}")
        return Decision(again_at=min(closes, holder.idle_since + pause))
    if now >= cuts:
        return Decision(swap_to=first.preset, cut=True,
                        why=f"{holder.preset}'s drain ({span_text(holder.drain)}) is over with "
                        f"{holder.in_flight} requests in flight; {chosen}")
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
