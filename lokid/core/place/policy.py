"""Where an engine starts, and which idle engines make room for it (issue 29, item 4).

The figures are bytes per device (``GPU0``…, ``host``): each device's total, the
operator's reserve and what processes lokid does not manage hold (``others``); each
running engine's footprint (measured where it was, estimated before); each waiting
preset's need. :func:`decide` answers, for every preset whose requests wait, one of:

- **start** it now, on the devices named (best fit: the device whose room is the
  smallest that holds it, so big rooms stay whole for big models);
- **evict** idle engines first, then start it (the next decision, once they stopped);
- **hold** its requests: it could fit, but not now (an engine in the way has requests
  in flight, or is younger than its own load, or memory is held by others); the reason
  names the figures, and ``again_at`` says when the answer may change by time alone;
- **refuse** it: it cannot fit on this host at all, even with every engine stopped
  ("needs 82.0 GiB on one GPU; the largest has 80.0 GiB").

A device whose room is unknown (the driver and the engine's ``--list-devices`` could not
say; :data:`ANY_GPU` where the host's GPUs themselves could not be listed) is neither a
reason to refuse nor to wait (issue 44, item 10): read as "no such GPU", a host whose
driver did not answer refused every GPU preset. The part of a need on such a device is
left out of the figures (:func:`placeable`), and its words say so.

The rules, each against a failure seen in the peers or in lokid's groups:

- no start that cannot fit: a preset starts only into room its footprint fits (Ollama
  starts on a wrong estimate and fails out of memory, its #16830);
- never evict an engine marked ``keep``, nor one with requests in flight, nor one
  starting. Once the oldest waiting request has waited ``min(max_wait, drain)``, every
  engine of its plan is *closed* together (``Plan.closing``: the edge gives them no new
  request, so they drain; one closed alone drains while the others are busy again).
  An engine closed for a whole drain but its head start is evicted anyway (``cut``),
  as a group's holder is (:mod:`lokid.core.serve.swaps`); one the edge did not close never is;
- an eviction is worth its cost, three ways:
  - no engine is evicted while it is younger (since its READY) than its own measured
    load, unless the request it is evicted for has waited longer than that;
  - nor within :data:`PAUSE` of its last request, or :data:`GAP_FACTOR` of its
    clients' own interval (``Resident.gap``), at most its load: a team's engine is not
    evicted in the gap between two of its requests;
  - the waiting requests must have paid for it (rent or buy): their waits, summed,
    reach :data:`RENT` times the victim's load, scaled by how likely its clients come
    back within it (its load over their interval, at most 1) and decaying as it idles
    (by *e* every :data:`DECAY` intervals). A burst of requests pays at once; a single
    request for a rare model waits for a busy team's engine, not the other way round;
- among the engines of a device, the one whose next request is due last first (its
  last one plus its interval: least recently used where intervals are unknown); among
  devices, the one whose engines are worth least (their loads over their intervals),
  then the fewest evictions, then the least memory;
- waiting requests are batched per preset (one start for all), and the preset whose
  request waited longest is placed first: a younger preset may start only on devices
  the older one's plan does not need, so the oldest is never starved by small ones.

What the constants cost, measured by ``benchmarks/placement_sim.py`` (2 × 80 GiB, 10
presets, 10,000 requests of a team; seeds 1 and 2): cold starts per 1,000 requests 46.0
and 46.2 with p50 waits of 6.6 and 8.2 s (llama.cpp's router at ``--models-max 2``: 52.0
and 48.4 at p50 49.1 and 52.0 s); with RENT 16, 55.6 and 51.5 at 4.9 and 5.3 s; with
RENT 1 and no interval, 127.7 and 123.9 at 3.1 and 3.8 s. The price is paid by a lone
user switching models: a model of 10 s load left 60 s ago by a user who asked every
30 s costs the next request for another model ``28 × 10 × 1/3 × e^(-60/240)`` = 73 s
of waiting before the eviction.

Pure: times are the caller's monotonic clock; the gateway runs it at every change.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from ..serve.replicas import is_replica
from ..serve.swaps import DEFAULT_COST, MAX_WAIT, NEVER, PAUSE

HOST = "host"
# in a map of rooms that could not be read: every GPU the host's list does not name (the
# list itself could not be read)
ANY_GPU = "GPU*"
GIB = 2**30
# An idle engine whose clients come back every ``gap`` seconds (its recent mean interval
# between requests) is kept this many gaps after its last request, at most its own load
# cost: evicting a popular engine in the pause between two of its requests costs a load.
GAP_FACTOR = 4.0
# An eviction is paid for by waiting: the waiting requests of the preset it is for must
# have waited, together, this many times the victim's own load cost (rent or buy).
RENT = 28.0
DECAY = 8.0   # the rent falls by e each DECAY intervals of its clients the engine idles
EPS = 1e-6   # seconds: a time the rule gave as again_at counts as reached at that time


def size_text(n: float) -> str:
    """Bytes for a person: GiB with one decimal from 1 GiB, else MiB."""
    return f"{n / GIB:.1f} GiB" if abs(n) >= GIB else f"{n / 2**20:.0f} MiB"


@dataclass(frozen=True)
class Device:
    """A place engines take memory from: a GPU, or the host (RAM)."""

    name: str
    total: int           # bytes
    reserve: int = 0     # headroom the operator keeps free (lokid.toml)
    others: int = 0      # held by processes lokid does not manage (the driver's figure)

    @property
    def usable(self) -> int:
        """What lokid's engines may hold together on it, at most."""
        return max(0, self.total - self.reserve - self.others)

    @property
    def capacity(self) -> int:
        """What lokid's engines could hold with every other process gone: what a
        refusal is judged on (memory others hold may be freed; the reserve is not)."""
        return max(0, self.total - self.reserve)

    @property
    def gpu(self) -> bool:
        return self.name != HOST


@dataclass(frozen=True)
class Need:
    """What a start of a preset needs: bytes on named devices (explicit ``gpus``, the
    host's share) and, for ``gpus = "auto"``, ``per_gpu`` bytes on each of ``count``
    GPUs lokid chooses."""

    preset: str
    fixed: Mapping[str, int] = field(default_factory=dict)
    per_gpu: int = 0
    count: int = 0
    # its load, seconds: measured, or the gateway's estimate from its need before a measure
    # (lokid.gateway.groups.swap_cost); None: unknown (DEFAULT_COST)
    cost: float | None = None


@dataclass(frozen=True)
class Resident:
    """An engine that runs, or starts."""

    preset: str
    held: Mapping[str, int]     # bytes per device
    in_flight: int = 0
    ready_since: float = NEVER  # when it became ready
    idle_since: float = NEVER   # when its last request in flight ended (or its READY)
    last_used: float = NEVER    # when it last had a request
    cost: float | None = None   # its own load, seconds: as a Need's
    gap: float | None = None    # its recent mean interval between requests (None: unknown)
    drain: float = 120.0        # serve.drain, seconds
    keep: bool = False          # serve.keep: never evicted
    starting: bool = False      # its load is under way (or its stop: not evictable again)
    stopping: bool = False      # its stop is under way: its memory comes free once gone
    closing: bool = False       # the edge gives it no new request (a last plan's Hold)
    closed_since: float = NEVER  # since when, without a break (the edge's clock)


@dataclass(frozen=True)
class Waiting:
    """The requests waiting for one preset to start: its need, and since when the
    oldest of them waits."""

    need: Need
    since: float
    count: int = 1
    waited: float | None = None   # the waits of its requests, summed (None: the oldest's)


@dataclass(frozen=True)
class Start:
    preset: str
    devices: tuple[str, ...]    # the GPUs chosen for per_gpu (() when none are)
    why: str


@dataclass(frozen=True)
class Evict:
    preset: str                 # the engine to stop
    to_make_room_for: str
    cut: bool                   # its drain is over: stopped with requests in flight
    why: str


@dataclass(frozen=True)
class Hold:
    preset: str
    why: str
    closing: tuple[str, ...] = ()   # engines that take no new request until they drain


@dataclass(frozen=True)
class Refuse:
    preset: str
    why: str


@dataclass(frozen=True)
class Plan:
    starts: tuple[Start, ...] = ()
    evictions: tuple[Evict, ...] = ()
    holds: tuple[Hold, ...] = ()
    refusals: tuple[Refuse, ...] = ()
    again_at: float | None = None   # decide again then, if nothing changed before

    @property
    def closing(self) -> frozenset[str]:
        return frozenset(name for h in self.holds for name in h.closing)


def cost_of(cost: float | None) -> float:
    return DEFAULT_COST if cost is None or cost < 0 else cost


def room_unknown(need: Need, devices: Sequence[Device],
                 unknown: Mapping[str, str]) -> dict[str, str]:
    """The devices of ``need`` whose room is unknown, and why (``unknown``: per device,
    :data:`ANY_GPU` for every GPU not listed); :data:`ANY_GPU` for the GPUs to be chosen
    at start (``count``) where the host's GPUs could not be listed."""
    listed = {d.name for d in devices}
    out = {name: unknown.get(name) or unknown[ANY_GPU] for name in need.fixed
           if name in unknown or (ANY_GPU in unknown and name != HOST and name not in listed)}
    if need.count > 0 and ANY_GPU in unknown:
        out[ANY_GPU] = unknown[ANY_GPU]
    return out


def placeable(need: Need, unknown: Mapping[str, str]) -> Need:
    """``need`` without its part on devices whose room is unknown (:func:`room_unknown`'s
    answer): what is placed by figures. Nothing left: it starts at once."""
    if not unknown:
        return need
    chosen = ANY_GPU not in unknown
    return Need(need.preset, {d: n for d, n in need.fixed.items() if d not in unknown},
                need.per_gpu if chosen else 0, need.count if chosen else 0, need.cost)


def never_fits(need: Need, devices: Sequence[Device],
               unknown: Mapping[str, str] | None = None) -> str:
    """Why ``need`` cannot fit on these devices even with every engine stopped and the
    reserves kept, "" when it can: for ``lokid plan`` and the gateway's refusal at once.
    What other processes hold is no reason to refuse (they may free it): a start it is
    in the way of waits, and its hold says so. Nor is a room that is ``unknown`` (per
    device, :data:`ANY_GPU`: see the module docstring): the GPUs whose room is unknown
    may hold what the known ones cannot."""
    unknown = unknown or {}
    need = placeable(need, room_unknown(need, devices, unknown))
    by_name = {d.name: d for d in devices}
    for name, nbytes in need.fixed.items():
        d = by_name.get(name)
        if d is None:
            return f"needs {size_text(nbytes)} on {name}, which this host does not have"
        if nbytes > d.capacity:
            return f"needs {size_text(nbytes)} on {name}; it has {size_text(d.capacity)}" + \
                _usable_note(d)
    if need.count > 0:
        gpus = sorted((d for d in devices if d.gpu and d.name not in need.fixed),
                      key=lambda d: -d.capacity)
        big = [d for d in gpus if d.capacity >= need.per_gpu]
        maybe = sum(1 for name in unknown if name not in (HOST, ANY_GPU)
                    and name not in by_name and name not in need.fixed)
        if len(big) + maybe < need.count:
            where = "one GPU" if need.count == 1 else f"each of {need.count} GPUs"
            if not gpus:
                return f"needs {size_text(need.per_gpu)} on {where}; this host has no GPU"
            largest = gpus[0]
            return (f"needs {size_text(need.per_gpu)} on {where}; "
                    + (f"the largest has {size_text(largest.capacity)}"
                       + _usable_note(largest) if need.count == 1 or not big else
                       f"only {len(big)} of {len(gpus)} GPUs have that much"))
    return ""


def _usable_note(d: Device) -> str:
    return f" of {size_text(d.total)} ({size_text(d.reserve)} reserved)" if d.reserve else ""


def _room(devices: Sequence[Device], residents: Sequence[Resident]) -> dict[str, int]:
    room = {d.name: d.usable for d in devices}
    for r in residents:
        for name, nbytes in r.held.items():
            if name in room:
                room[name] -= nbytes
    return room


def fits_now(need: Need, devices: Sequence[Device], residents: Sequence[Resident]) -> bool:
    """Whether a start of ``need`` fits beside the residents without evicting any (what
    a gateway tells its peers, issue 30: a peer routes to the host that starts soonest)."""
    return _place(need, _room(devices, residents), ()) is not None


def decide(devices: Sequence[Device], residents: Sequence[Resident],
           waiting: Sequence[Waiting], now: float, *, max_wait: float = MAX_WAIT,
           pause: float = PAUSE) -> Plan:
    """What to do now for the presets whose requests wait (see the module docstring)."""
    room = _room(devices, residents)
    running = {r.preset for r in residents}
    claimed: set[str] = set()     # engines an older waiting preset's plan will evict
    blocked: set[str] = set()     # devices an older waiting preset's plan needs
    starts: list[Start] = []
    evictions: list[Evict] = []
    holds: list[Hold] = []
    refusals: list[Refuse] = []
    again: list[float] = []
    for w in sorted(waiting, key=lambda w: (w.since, w.need.preset)):
        need = w.need
        if need.preset in running:
            continue   # it runs or starts: its requests go to it
        why = never_fits(need, devices)
        if why:
            refusals.append(Refuse(need.preset, f"preset {need.preset!r} {why}"))
            continue
        chosen = _place(need, room, blocked)
        if chosen is not None:
            _take(room, need, chosen)
            starts.append(Start(need.preset, chosen, _start_why(need, chosen, room)))
            continue
        victims_pool = [r for r in residents if r.preset not in claimed and not r.keep
                        and not r.starting]
        waited = now - w.since
        ready = _Evictable(now, w, pause)
        plan = _evict_plan(need, room, blocked, victims_pool, ready)
        if plan is None:
            holds.append(Hold(need.preset, _cannot_make_room(need, room, residents, blocked,
                                                             devices)))
            continue
        devices_used, victims = plan
        blocked.update(devices_used)
        claimed.update(v.preset for v in victims)
        for v in victims:
            for name, nbytes in v.held.items():
                if name in room:
                    room[name] += nbytes
        chosen_devices = tuple(d for d in devices_used if d not in need.fixed)
        _take(room, need, chosen_devices)
        blockers = [v for v in victims if not ready(v)]
        if not blockers:
            for v in victims:
                evictions.append(Evict(v.preset, need.preset, False,
                                       _evict_why(v, need, w, now)))
            continue
        # something in the way: it drains, or it is too young to be worth evicting yet.
        # Once the oldest request has waited its turn, every engine of the plan is
        # closed together: one closed alone drains while the others, still taking
        # requests, are busy again by then, and the plan never completes
        opened = waited >= min(max_wait, min(v.drain for v in victims))
        closing = [v.preset for v in blockers if opened]
        reasons: list[str] = []
        cuts: set[str] = set()
        for v in blockers:
            if v.in_flight > 0:
                # cut only an engine closed for this plan before: one that took requests
                # until now gets its drain once closed, not a cut for a wait it had no
                # part in (the edge says which are closed: Resident.closing)
                if waited >= v.drain and v.closing \
                        and now - v.closed_since >= v.drain - min(max_wait, v.drain):
                    cuts.add(v.preset)
                    continue
                opens = min(max_wait, v.drain)
                again.append(w.since + (v.drain if opened else opens) if w.since
                             + (v.drain if opened else opens) > now else now + v.drain)
                reasons.append(f"{v.preset} has {v.in_flight} requests in flight"
                               + (" (it takes no new one until they end)" if opened else ""))
            else:
                at = _evictable_at(v, w, now, pause)
                # decide again then, or when the plan's engines are to be closed
                again.append(at if opened else
                             min(at, w.since + min(max_wait, min(x.drain for x in victims))))
                reasons.append(f"{v.preset} is worth keeping {max(0.0, at - now):.1f} s more "
                               f"(its load costs {cost_of(v.cost):.1f} s)"
                               + (" (it takes no new request)" if opened else ""))
        if reasons:   # a cut only when it completes the room: never for nothing
            holds.append(Hold(need.preset, f"preset {need.preset!r} {_need_text(need)}: "
                              f"waits, because {'; '.join(reasons)}", tuple(closing)))
            continue
        for v in victims:
            why = _evict_why(v, need, w, now)
            if v.preset in cuts:
                why = (f"{v.preset}'s drain ({v.drain:.0f} s) is over with {v.in_flight} "
                       f"requests in flight; {why}")
            evictions.append(Evict(v.preset, need.preset, v.preset in cuts, why))
    return Plan(tuple(starts), tuple(evictions), tuple(holds), tuple(refusals),
                min((t for t in again if t > now), default=None))


# --- placing ---------------------------------------------------------------------------

def _place(need: Need, room: Mapping[str, int], blocked: Iterable[str]
           ) -> tuple[str, ...] | None:
    """The GPUs chosen for ``need`` without evicting anything (best fit), () when it
    chooses none; None when it does not fit now."""
    blocked = set(blocked)
    for name, nbytes in need.fixed.items():
        if name in blocked or room.get(name, -1) < nbytes:
            return None
    if need.count <= 0:
        return ()
    fits = sorted((left, name) for name, left in room.items()
                  if name != HOST and name not in need.fixed and name not in blocked
                  and left >= need.per_gpu)
    if len(fits) < need.count:
        return None
    return tuple(sorted(name for _, name in fits[:need.count]))


def _take(room: dict[str, int], need: Need, chosen: Iterable[str]) -> None:
    for name, nbytes in need.fixed.items():
        room[name] = room.get(name, 0) - nbytes
    for name in chosen:
        room[name] = room.get(name, 0) - need.per_gpu


def _evict_plan(need: Need, room: Mapping[str, int], blocked: set[str],
                pool: Sequence[Resident], evictable_now: Callable[[Resident], bool]
                ) -> tuple[tuple[str, ...], list[Resident]] | None:
    """The devices and the engines to evict so that ``need`` fits: for each device in
    question, engines on it least recently used first (those evictable now before the
    others); among the GPUs for ``per_gpu``, those that cost the fewest evictions, then
    the least memory. None when even every engine of the pool would not make room."""
    def order(r: Resident) -> tuple[bool, bool, float, str]:
        # one closed for a plan before stays the plan's: a plan that moves from one busy
        # engine to another closes each in turn and drains none. Then the one whose next
        # request is due last: its last request plus its clients' interval (least
        # recently used, where the interval is unknown or the same)
        return (not evictable_now(r), not r.closing, _due(r), r.preset)

    pool = sorted(pool, key=order)

    def victims_for(name: str, nbytes: int, already: list[Resident]) -> list[Resident] | None:
        left = room.get(name, 0) + sum(v.held.get(name, 0) for v in already)
        chosen: list[Resident] = []
        for r in pool:
            if left >= nbytes:
                break
            if r in already or r.held.get(name, 0) <= 0:
                continue
            chosen.append(r)
            left += r.held[name]
        return chosen if left >= nbytes else None

    victims: list[Resident] = []
    used: list[str] = []
    for name, nbytes in need.fixed.items():
        if name in blocked:
            return None
        more = victims_for(name, nbytes, victims)
        if more is None:
            return None
        victims += more
        used.append(name)
    if need.count > 0:
        options: list[tuple[float, int, int, str, list[Resident]]] = []
        for name in room:
            if name == HOST or name in need.fixed or name in blocked:
                continue
            more = victims_for(name, need.per_gpu, victims)
            if more is not None:
                options.append((sum(_worth(v) for v in more), len(more),
                                sum(v.held.get(name, 0) for v in more), name, more))
        options.sort(key=lambda o: o[:4])
        if len(options) < need.count:
            return None
        for _, _, _, name, more in options[:need.count]:
            victims += [v for v in more if v not in victims]
            used.append(name)
    return tuple(used), victims


def _protected(r: Resident, pause: float) -> float:
    """Seconds an idle ``r`` is kept after its last request: the pause between a client's
    answer and its next request, or GAP_FACTOR of its clients' own interval, never longer
    than its load costs."""
    cost = cost_of(r.cost)
    kept = min(pause, cost)
    if r.gap is not None and r.gap > 0:
        kept = max(kept, min(cost, GAP_FACTOR * r.gap))
    return kept


def _worth(r: Resident) -> float:
    """What keeping ``r`` is worth: the seconds of load its clients would wait per second
    if it were evicted (its reload over their interval; 0 where the interval is unknown)."""
    return cost_of(r.cost) / r.gap if r.gap is not None and r.gap > 0 else 0.0


def _due(r: Resident) -> float:
    """When ``r``'s next request is expected: its last one plus its clients' interval
    (unknown: its last one, which orders it least recently used first)."""
    return r.last_used + (r.gap if r.gap is not None and r.gap > 0 else 0.0)


def _rent(r: Resident, now: float) -> float:
    """The waiting (seconds, summed over the requests that wait) an eviction of ``r``
    must have been paid with (rent or buy): RENT times its reload, as likely to be needed
    as its clients are to come back: the share decays with its idle time over their
    interval (over its reload where the interval is unknown). An engine whose clients
    left long ago costs nothing to evict; one in the pause of a busy team costs most."""
    cost = cost_of(r.cost)
    scale = r.gap if r.gap is not None and r.gap > 0 else cost
    idle = max(0.0, now - r.idle_since)
    demand = min(1.0, cost / r.gap) if r.gap is not None and r.gap > 0 else 1.0
    return RENT * cost * demand * math.exp(-idle / max(DECAY * scale, 1e-3))


def _paid(w: Waiting, now: float) -> float:
    return w.waited if w.waited is not None else now - w.since


def _evictable(r: Resident, now: float, w: Waiting, pause: float,
               max_wait: float = MAX_WAIT) -> bool:
    """Whether ``r`` may be evicted now for ``w``'s requests."""
    if r.in_flight > 0 or r.keep or r.starting:
        return False
    cost = cost_of(r.cost)
    # a closed engine gets no request: waiting for its clients to come back is moot
    kept = min(pause, cost) if r.closing else _protected(r, pause)
    if now - r.idle_since + EPS < kept:
        return False
    if _paid(w, now) + EPS < _rent(r, now):
        return False
    return now - r.ready_since + EPS >= cost or now - w.since + EPS >= cost


@dataclass(frozen=True)
class _Evictable:
    now: float
    w: Waiting
    pause: float

    def __call__(self, r: Resident) -> bool:
        return _evictable(r, self.now, self.w, self.pause)


def _evictable_at(r: Resident, w: Waiting, now: float, pause: float) -> float:
    """When an idle ``r`` becomes evictable for ``w``'s requests (if nothing changes)."""
    cost = cost_of(r.cost)
    worth = min(r.ready_since + cost, w.since + cost)
    # when the rent is paid: the waiting grows with the requests that wait, the rent
    # decays; the oldest request's max_wait bounds it
    paid = now + max(0.0, _rent(r, now) - _paid(w, now)) / max(1, w.count)
    kept = min(pause, cost) if r.closing else _protected(r, pause)
    return max(worth, paid, r.idle_since + kept)


# --- words -----------------------------------------------------------------------------

def _need_text(need: Need) -> str:
    parts = [f"{size_text(n)} on {name}" for name, n in need.fixed.items()]
    if need.count:
        where = "one GPU" if need.count == 1 else f"each of {need.count} GPUs"
        parts.append(f"{size_text(need.per_gpu)} on {where}")
    return "needs " + (" and ".join(parts) or "nothing")


def _start_why(need: Need, chosen: Sequence[str], room: Mapping[str, int]) -> str:
    where = f" on {', '.join(chosen)}" if chosen else ""
    left = ", ".join(f"{name} {size_text(room[name])}" for name in
                     (*need.fixed, *chosen) if name in room)
    return f"{need.preset} {_need_text(need)}: fits{where}; free after it: {left}"


def _evict_why(v: Resident, need: Need, w: Waiting, now: float) -> str:
    used = "never used" if v.last_used == NEVER else f"last used {now - v.last_used:.1f} s ago"
    freed = ", ".join(f"{size_text(n)} on {name}" for name, n in v.held.items())
    return (f"evicting {v.preset} ({used}, least recently used; frees {freed}) for "
            f"{need.preset} ({_need_text(need)}; {w.count} requests waited, the oldest "
            f"{now - w.since:.1f} s); reloading {v.preset} later costs "
            f"{cost_of(v.cost):.1f} s")


def _cannot_make_room(need: Need, room: Mapping[str, int], residents: Sequence[Resident],
                      blocked: set[str], devices: Sequence[Device]) -> str:
    names = [*need.fixed] or sorted(n for n in room if n != HOST)
    free = ", ".join(f"{name} has {size_text(max(0, room.get(name, 0)))} free" for name in names)
    kept = [r.preset for r in residents if r.keep and not is_replica(r.preset)]
    replicas = [r.preset for r in residents if is_replica(r.preset)]
    starting = [r.preset for r in residents if r.starting and not r.stopping]
    stopping = [r.preset for r in residents if r.stopping]
    why = []
    if kept:
        why.append(f"{', '.join(kept)} {'is' if len(kept) == 1 else 'are'} kept (serve.keep, "
                   "or not on demand: it would not come back by itself)")
    if replicas:
        why.append(f"{', '.join(replicas)} {'is' if len(replicas) == 1 else 'are'} kept (a "
                   "replica: the gateway's scaling rule stops those it started once idle)")
    if starting:
        why.append(f"{', '.join(starting)} {'is' if len(starting) == 1 else 'are'} starting")
    if stopping:
        why.append(f"{', '.join(stopping)} {'is' if len(stopping) == 1 else 'are'} stopping "
                   "(the memory is free once gone)")
    if blocked:
        why.append(f"{', '.join(sorted(blocked))} {'is' if len(blocked) == 1 else 'are'} "
                   "promised to a preset that waited longer")
    others = [d for d in devices if d.others and d.name in names]
    if others:
        why.append("other processes hold " + ", ".join(f"{size_text(d.others)} on {d.name}"
                                                      for d in others))
    return (f"preset {need.preset!r} {_need_text(need)}; {free}; even evicting every idle "
            f"engine would not make room: {'; '.join(why)}")
