"""Fair share between keys where requests wait for an engine's slots (issue 46, items 3, 4).

The gateway holds what an engine cannot start now (:mod:`lokid.gateway.admission` is the
asyncio edge of this module): never more requests in flight to an engine than its slots,
so that one key cannot fill the engine's own queue, which is FIFO across everyone (a key
that opened 32 streams pushed every other key's request behind all of them). Who goes
next is decided here, pure, and each rule is here for the failure it prevents:

- **interactive before batch**: a request of an interactive key waiting is admitted before
  any batch key's, whatever came first (a batch job's hundred requests do not stand in
  front of a person typing);
- **equal shares between the keys of a class, by start-time fair queuing** (Goyal et al.,
  1996): each request is tagged when it arrives with ``max(V, the key's last tag + 1)``,
  ``V`` being the tag of the request last admitted in its class; the waiting request
  with the smallest tag goes first, then the key with fewer requests in flight, then the
  earlier. A key that sends 10 requests at once gets tags ``V .. V+9``, a key that sends
  one meanwhile gets ``V``: it goes after at most one of the other's, never behind all
  ten (FIFO across keys); a key idle for an hour starts at ``V``, not at the tag it had,
  so it cannot claim the idle hour as credit and hold every slot in turn. Each request
  costs 1 (its tokens are not known before it runs): shares are of requests, not tokens;
- **a key's own requests in their order**: its tags only grow;
- **per-key max_in_flight** (:attr:`lokid.core.serve.keys.Limits.max_in_flight`), counted over
  every preset of the gateway: a key at its limit waits, and its waiting does not hold
  back another key's request behind it;
- **a reserve for interactive keys**: nothing is preempted (a stream holds its slot to its
  end), so a batch flood holding every slot makes a person wait for a long stream to
  end. A batch request is not admitted where it would leave fewer free slots than
  ``reserve``: the most interactive requests (in flight and waiting) the preset had at
  once in the last :data:`RECENT` seconds, and 1 while one came in the last
  :data:`KEEP_ONE` seconds, at most ``slots - 1`` (a batch key always keeps one slot; an
  engine with one slot has no reserve: its batch would otherwise wait for minutes of
  silence after every interactive request). The interactive keys' own demand sizes it:
  three people chatting on a 4-slot engine keep 3 slots theirs while they chat; after a
  pause of a minute the first of them to come back finds one slot free and the others
  wait only for that person's short answer, not for a batch stream to end (measured with
  benchmarks/fair_share.py: without that one slot, the interactive time to first token's
  p95 under a batch flood was the length of a batch stream); once no interactive key
  came for :data:`KEEP_ONE` seconds, a batch key has the whole engine again;
- **bounded queues**: at most ``max_queue`` requests wait per preset and
  ``max_queue_per_key`` per key and preset; one more is refused (:class:`QueueFull`) with
  its position and an estimated wait from the measured pace (the mean time in the engine
  of the last :data:`PACE_KEPT` requests, over the slots), which the gateway answers as
  429 with ``Retry-After``: a queue without a bound held clients for hours and told them
  nothing (Ollama #2004, #7758);
- **a bound on what it keeps**: a key's tag is kept only while it has a request waiting or
  in flight, so 10,000 keys that came once cost nothing.

Part of the pure core: no I/O, no clock of its own (every call is given ``now``).
"""

from __future__ import annotations

import math
from collections import Counter, deque
from dataclasses import dataclass, field

RECENT = 60.0          # seconds an interactive key's demand keeps its reserve
KEEP_ONE = 600.0       # seconds one slot stays kept after the last interactive request
PACE_KEPT = 32         # requests whose time in the engine the pace is measured over
DEFAULT_PACE = 2.0     # seconds a request is taken to hold a slot before any was measured
UNLIMITED = 1 << 30    # slots of an API elsewhere: only the per-key limit holds its requests
DEFAULT_MAX_QUEUE = 512
DEFAULT_MAX_QUEUE_PER_KEY = 128
MAX_QUEUE = 1_000_000     # the largest bound lokid.toml may set
MAX_RESERVE_LEVELS = 64   # interactive levels tracked for the reserve (a bound on memory)


class QueueFull(Exception):
    """A request refused: its preset's queue (``scope == "preset"``) or its key's queue for
    that preset (``"key"``) holds its bound."""

    def __init__(self, preset: str, key: str, scope: str, bound: int, waiting: int,
                 retry_after: int):
        self.preset, self.key, self.scope = preset, key, scope
        self.bound, self.waiting, self.retry_after = bound, waiting, retry_after
        whose = f"preset {preset!r}" if scope == "preset" else \
            f"key {key!r} on preset {preset!r}"
        super().__init__(f"the queue of {whose} is full: {waiting} requests wait (at most "
                         f"{bound}); this one would be number {waiting + 1}; try again in "
                         f"about {retry_after} s")


@dataclass(eq=False, slots=True)
class Ticket:
    """One request, waiting or in flight."""
    preset: str
    key: str
    batch: bool
    limit: int | None       # the key's max_in_flight
    tag: int
    seq: int
    since: float            # when it arrived
    admitted_at: float | None = None
    done: bool = False

    @property
    def admitted(self) -> bool:
        return self.admitted_at is not None

    def waited(self) -> float:
        return 0.0 if self.admitted_at is None else self.admitted_at - self.since


@dataclass
class _Preset:
    slots: int
    running: int = 0
    # waiting tickets by class (False: interactive, True: batch), then by key, in order
    waiting: dict[bool, dict[str, deque[Ticket]]] = field(
        default_factory=lambda: {False: {}, True: {}})
    queued: int = 0
    per_key: Counter[str] = field(default_factory=Counter)   # waiting, by key
    vtime: dict[bool, int] = field(default_factory=lambda: {False: 0, True: 0})
    last_tag: dict[str, int] = field(default_factory=dict)
    own: Counter[str] = field(default_factory=Counter)      # in flight here, by key
    interactive: int = 0         # interactive requests in flight and waiting
    seen_at: list[float] = field(default_factory=list)   # level n last reached at [n]
    pace: deque[float] = field(default_factory=lambda: deque(maxlen=PACE_KEPT))


class FairShare:
    """Every preset's queue of the gateway, and each key's requests in flight."""

    def __init__(self, max_queue: int = DEFAULT_MAX_QUEUE,
                 max_queue_per_key: int = DEFAULT_MAX_QUEUE_PER_KEY):
        self.max_queue = max_queue
        self.max_queue_per_key = max_queue_per_key
        self.presets: dict[str, _Preset] = {}
        self.in_flight: Counter[str] = Counter()   # by key, over every preset
        self.queued_by_key: Counter[str] = Counter()   # waiting, by key, over every preset
        self.seq = 0

    # --- what the gateway tells it ------------------------------------------------------

    def set_slots(self, preset: str, slots: int, now: float) -> list[Ticket]:
        """``preset``'s engine has ``slots`` (at least 1); the tickets it admits now."""
        q = self._preset(preset, slots)
        q.slots = max(1, slots)
        return self._fill(preset, q, now)

    def arrive(self, preset: str, key: str, *, batch: bool = False, limit: int | None = None,
               slots: int, now: float, per_key_bound: bool = True) -> Ticket:
        """A request of ``key`` for ``preset`` (whose engine has ``slots``): its ticket,
        admitted at once where a slot is free and no one it must not pass waits.
        QueueFull past a bound (``per_key_bound=False``: the preset's bound only, for a
        gateway without keys, where every client is the same key)."""
        q = self._preset(preset, slots)
        q.slots = max(1, slots)   # the engine's, as it runs now
        if q.queued >= self.max_queue or (
                per_key_bound and q.per_key[key] >= self.max_queue_per_key):
            scope = "preset" if q.queued >= self.max_queue else "key"
            waiting = q.queued if scope == "preset" else q.per_key[key]
            raise QueueFull(preset, key, scope, self.max_queue if scope == "preset"
                            else self.max_queue_per_key, waiting,
                            self._retry_after(q, q.queued))
        tag = max(q.vtime[batch], q.last_tag.get(key, 0))
        q.last_tag[key] = tag + 1
        self.seq += 1
        t = Ticket(preset, key, batch, limit, tag, self.seq, now)
        if not q.queued and q.running < q.slots and (
                limit is None or self.in_flight[key] < limit) and (
                not batch or q.slots - q.running > self._reserve(q, now)):
            # nobody waits and a slot is free: what _fill would pick, without its pass
            # (benchmarks/keys_cost.py: a request's CPU in the gate, most of it here)
            q.vtime[batch] = tag   # tag >= vtime
            q.running += 1
            q.own[key] += 1
            self.in_flight[key] += 1
            t.admitted_at = now
            if not batch:
                self._interactive(q, +1, now)
            return t
        q.waiting[batch].setdefault(key, deque()).append(t)
        q.queued += 1
        q.per_key[key] += 1
        self.queued_by_key[key] += 1
        if not batch:
            self._interactive(q, +1, now)
        self._fill(preset, q, now)
        return t

    def leave(self, t: Ticket, now: float) -> list[Ticket]:
        """``t`` is given up (its client went while it waited, or its answer ended):
        the tickets admitted in its place."""
        if t.done:
            return []
        t.done = True
        q = self.presets[t.preset]
        if t.admitted:
            q.running -= 1
            q.own[t.key] -= 1
            if q.own[t.key] <= 0:
                del q.own[t.key]
            self.in_flight[t.key] -= 1
            if self.in_flight[t.key] <= 0:
                del self.in_flight[t.key]
            q.pace.append(max(0.0, now - (now if t.admitted_at is None else t.admitted_at)))
        else:
            line = q.waiting[t.batch][t.key]
            line.remove(t)
            if not line:
                del q.waiting[t.batch][t.key]
            self._unqueue(q, t.key)
        if not t.batch:
            self._interactive(q, -1, now)
        self._forget(q, t.key)
        admitted = self._fill(t.preset, q, now) if q.queued else self._idle(t.preset, q, now)
        if t.admitted and t.limit is not None and self.queued_by_key[t.key] > q.per_key[
                t.key]:   # its key waits elsewhere too: it may go on there now
            for name, other in self.presets.items():
                if name != t.preset and any(t.key in other.waiting[c] for c in (False, True)):
                    admitted += self._fill(name, other, now)
        return admitted

    done = leave

    # --- what it tells the gateway ------------------------------------------------------

    def position(self, t: Ticket) -> int:
        """How many waiting requests go before ``t`` as things stand (0: it is next)."""
        if t.admitted or t.done:
            return 0
        q = self.presets[t.preset]
        ahead = 0
        for batch in (False, True):
            for line in q.waiting[batch].values():
                for other in line:
                    if other is t:
                        continue
                    if (not batch and t.batch) or (batch == t.batch and (
                            other.tag, other.seq) < (t.tag, t.seq)):
                        ahead += 1
        return ahead

    def estimate(self, preset: str, ahead: int) -> float:
        """Seconds a request with ``ahead`` others before it is expected to wait: the mean
        time in the engine of recent requests, over the slots."""
        q = self.presets.get(preset)
        if q is None:
            return 0.0
        return self._pace(q) * (ahead + 1) / max(1, min(q.slots, UNLIMITED))

    def reserve(self, preset: str, now: float) -> int:
        q = self.presets.get(preset)
        return 0 if q is None else self._reserve(q, now)

    def waiting(self, preset: str) -> int:
        q = self.presets.get(preset)
        return 0 if q is None else q.queued

    def running(self, preset: str) -> int:
        q = self.presets.get(preset)
        return 0 if q is None else q.running

    # --- the rule -----------------------------------------------------------------------

    def _preset(self, preset: str, slots: int) -> _Preset:
        q = self.presets.get(preset)
        if q is None:
            q = self.presets[preset] = _Preset(max(1, slots))
        return q

    def _fill(self, preset: str, q: _Preset, now: float) -> list[Ticket]:
        admitted = []
        while q.running < q.slots:
            t = self._pick(q, now)
            if t is None:
                break
            line = q.waiting[t.batch][t.key]
            line.popleft()
            if not line:
                del q.waiting[t.batch][t.key]
            self._unqueue(q, t.key)
            q.vtime[t.batch] = max(q.vtime[t.batch], t.tag)
            q.running += 1
            q.own[t.key] += 1
            self.in_flight[t.key] += 1
            t.admitted_at = now
            admitted.append(t)
        if not q.queued:
            self._idle(preset, q, now)
        return admitted

    def _idle(self, preset: str, q: _Preset, now: float) -> list[Ticket]:
        """Nothing waits at ``preset``: forgotten when nothing runs either and no reserve
        is kept (a bound on what is kept); nobody to admit."""
        if not q.running and not q.interactive and \
                now - max(q.seen_at, default=-math.inf) > KEEP_ONE:
            del self.presets[preset]
        return []

    def _pick(self, q: _Preset, now: float) -> Ticket | None:
        free = q.slots - q.running
        for batch in (False, True):
            if batch and q.waiting[True] and free <= self._reserve(q, now):
                return None
            best: Ticket | None = None
            best_key: tuple[int, int, int] | None = None
            for key, line in q.waiting[batch].items():
                head = line[0]
                if head.limit is not None and self.in_flight[key] >= head.limit:
                    continue
                rank = (head.tag, q.own[key], head.seq)
                if best_key is None or rank < best_key:
                    best, best_key = head, rank
            if best is not None:
                return best
        return None

    def _reserve(self, q: _Preset, now: float) -> int:
        if q.slots <= 1 or q.slots >= UNLIMITED:
            return 0
        level = 0
        for n in range(len(q.seen_at) - 1, 0, -1):
            if q.interactive >= n or now - q.seen_at[n] <= RECENT:
                level = n
                break
        if level == 0 and len(q.seen_at) > 1 and now - q.seen_at[1] <= KEEP_ONE:
            level = 1
        return min(level, q.slots - 1)

    def _interactive(self, q: _Preset, change: int, now: float) -> None:
        q.interactive += change
        level = min(q.interactive, MAX_RESERVE_LEVELS)
        while len(q.seen_at) <= level:
            q.seen_at.append(now)
        for n in range(1, level + 1):
            q.seen_at[n] = now

    def _unqueue(self, q: _Preset, key: str) -> None:
        q.queued -= 1
        q.per_key[key] -= 1
        if q.per_key[key] <= 0:
            del q.per_key[key]
        self.queued_by_key[key] -= 1
        if self.queued_by_key[key] <= 0:
            del self.queued_by_key[key]

    def _forget(self, q: _Preset, key: str) -> None:
        if key not in q.own and key not in q.per_key:
            q.last_tag.pop(key, None)

    def _pace(self, q: _Preset) -> float:
        return sum(q.pace) / len(q.pace) if q.pace else DEFAULT_PACE

    def _retry_after(self, q: _Preset, ahead: int) -> int:
        slots = max(1, min(q.slots, UNLIMITED))
        return max(1, min(3600, math.ceil(self._pace(q) * (ahead + 1) / slots)))
