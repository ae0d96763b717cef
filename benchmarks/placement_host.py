#!/usr/bin/env python3
"""The simulated host of benchmarks/placement_sim.py: the trace, the GPUs, the engines
and the requests every placement rule acts on (issue 29; split out in issue 47).

Why a module of its own: lokid's rule and the peers' rules (benchmarks/placement_peers.py)
must act on the same host, counted the same way, or the table compares bookkeeping
rather than rules. What it counts, for every rule alike:

- a cold start: a load that completed; an out-of-memory start: a load whose true
  footprint did not fit what was free on its GPU (it holds what was free for its whole
  load time, then fails: the crash of a real engine), its requests wait and the rule
  tries again; a request that waited through :data:`MAX_TRIES` failed loads fails;
- a request's wait: its arrival to the start of its service; an engine serves
  :data:`SLOTS` requests at once and queues the rest;
- a stop cuts the requests the engine holds (counted as failed): a rule that waits for
  a drain stops only idle engines.

The host and the trace (seeded, deterministic):

- 2 GPUs of 80 GiB, no reserve, nothing else on them; engines stop at once;
- 10 presets of 4.4 to 69.7 GiB (:data:`PRESETS`: footprints in the style of measured
  ones, weights and KV cache, on one GPU each), 251 GiB in all; a load takes 2 s + 0.4 s
  per GiB (3.8 s to 29.9 s: a model read from the page cache);
- Zipf popularity (s = 1.1) in the order of :data:`PRESETS` (a mid-sized model first, the
  70 GiB one third): 37 % of the Poisson arrivals to the first, 3.0 % to the last;
- Poisson arrivals at ``--rate`` (1.5/s), plus bursts: at 1 per 600 s (Poisson), one of
  the 5 least popular presets gets 40 requests within 30 s; the first ``--requests``
  arrivals in time order are the trace;
- a request's service time is lognormal (median 2 s, σ 0.6, within 0.2–30 s).

Run alone, it prints the trace's make-up (requests per preset)::

    .venv/bin/python benchmarks/placement_host.py [--requests 10000] [--seed 1]
"""

# No "from __future__ import annotations": the dataclasses here must not look their module
# up in sys.modules (tests/packaging/test_scripts_import.py loads this file without one).
import argparse
import heapq
import math
import random
import sys
from collections import Counter, deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from lokid.core.place.policy import GIB
from lokid.core.serve.swaps import NEVER

GPUS = ("GPU0", "GPU1")
GPU_BYTES = 80 * GIB
SLOTS = 4                 # requests an engine serves at once; the rest queue on it
MAX_TRIES = 3             # failed loads a request waits through before its client gives up
# (name, true footprint in GiB), in the order of popularity (Zipf rank 1 first)
PRESETS: tuple[tuple[str, float], ...] = (
    ("qwen3-14b", 16.1), ("llama3.1-8b", 6.9), ("qwen2.5-72b-q6", 69.7),
    ("gemma3-27b", 22.8), ("gemma3-4b", 4.4), ("qwen3-32b", 27.4), ("mixtral-8x7b", 33.9),
    ("llama3.3-70b-q4", 47.2), ("mistral-nemo-12b", 13.6), ("qwen3-8b", 9.2))
ZIPF_S = 1.1
BURST_EVERY = 600.0       # seconds between bursts, on average
BURST_SIZE = 40
BURST_SPAN = 30.0


def load_time(nbytes: int) -> float:
    return 2.0 + 0.4 * nbytes / GIB


# --- the trace -------------------------------------------------------------------------

@dataclass(frozen=True)
class Preset:
    name: str
    footprint: int        # true bytes on its GPU
    load: float           # seconds


@dataclass(frozen=True)
class Arrival:
    at: float
    preset: str
    service: float


def presets_of(spec: Sequence[tuple[str, float]] = PRESETS) -> dict[str, Preset]:
    return {name: Preset(name, int(gib * GIB), load_time(int(gib * GIB))) for name, gib in spec}


def make_trace(n: int, seed: int, rate: float,
               spec: Sequence[tuple[str, float]] = PRESETS) -> list[Arrival]:
    """``n`` arrivals: Poisson at ``rate`` over Zipf popularity, plus bursts of rare ones."""
    rng = random.Random(seed)
    names = [name for name, _ in spec]
    weights = [1.0 / (rank ** ZIPF_S) for rank in range(1, len(names) + 1)]
    rare = names[len(names) // 2:]

    def service() -> float:
        return min(30.0, max(0.2, rng.lognormvariate(math.log(2.0), 0.6)))

    horizon = n / rate
    out: list[Arrival] = []
    t = 0.0
    while len(out) < n:
        t += rng.expovariate(rate)
        out.append(Arrival(t, rng.choices(names, weights)[0], service()))
    b = rng.expovariate(1.0 / BURST_EVERY)
    while b < horizon:
        preset = rng.choice(rare)
        for _ in range(BURST_SIZE):
            out.append(Arrival(b + rng.uniform(0.0, BURST_SPAN), preset, service()))
        b += rng.expovariate(1.0 / BURST_EVERY)
    out.sort(key=lambda a: a.at)
    return out[:n]


# --- the simulated host ----------------------------------------------------------------

@dataclass(eq=False)
class Req:
    preset: str
    arrival: float
    service: float
    begin: float | None = None
    failed: str = ""
    tries: int = 0


@dataclass(eq=False)
class Engine:
    preset: str
    held: dict[str, int]      # true bytes per device (a failing load: what it took)
    known: dict[str, int]     # what the rule believes it holds
    doomed: bool              # its load fails out of memory
    ready: bool = False
    serving: int = 0
    queue: deque[Req] = field(default_factory=deque)
    ready_since: float = NEVER
    idle_since: float = NEVER
    last_used: float = NEVER

    @property
    def in_flight(self) -> int:
        return self.serving + len(self.queue)


@dataclass(frozen=True)
class Result:
    rule: str
    requests: int
    cold_starts: int
    oom_starts: int
    failed: int
    stops: int
    waits: tuple[float, ...]
    mean_gib: float
    unserved: int             # still waiting when the events ran out (should be 0)
    stalls: int = 0           # lokid: holds at their own again_at that a later time ends
    waited_for: tuple[str, ...] = ()   # the preset of each of ``waits``, in their order
    loading: float = 0.0      # seconds of loads begun (completed or failed), all GPUs

    def slowest(self, share: float = 0.05) -> Counter[str]:
        """The presets of the ``share`` of requests that waited longest, counted."""
        n = max(1, int(share * len(self.waits)))
        order = sorted(range(len(self.waits)), key=lambda i: -self.waits[i])[:n]
        return Counter(self.waited_for[i] for i in order)

    def per_1000(self) -> float:
        return 1000.0 * self.cold_starts / self.requests

    def oom_per_1000(self) -> float:
        return 1000.0 * self.oom_starts / self.requests

    def wait(self, q: float) -> float:
        """The ``q`` quantile of the waits of the requests served (1.0: the longest)."""
        if not self.waits:
            return math.nan
        s = sorted(self.waits)
        return s[min(len(s) - 1, int(q * len(s)))]


class Host:
    """The GPUs, the engines and the requests: what every rule acts on, one engine per
    preset at most. A rule is a callable run after every event (its ``step``)."""

    def __init__(self, presets: dict[str, Preset], gpus: Sequence[str] = GPUS,
                 gpu_bytes: int = GPU_BYTES) -> None:
        self.presets = presets
        self.gpus = tuple(gpus)
        self.gpu_bytes = gpu_bytes
        self.engines: dict[str, Engine] = {}
        self.pending: dict[str, deque[Req]] = {name: deque() for name in presets}
        self.last_arrival: dict[str, float] = {}
        self.gap: dict[str, float] = {}   # the mean interval between its requests
        self.now = 0.0
        self._events: list[tuple[float, int, str, object]] = []
        self._seq = 0
        self._timers: set[float] = set()
        self.cold_starts = self.oom_starts = self.failed = self.stops = 0
        self.loading = 0.0
        self.waits: list[float] = []
        self.waited_for: list[str] = []
        self._area = 0.0          # byte-seconds in use
        self._area_at = 0.0
        self.on_loaded: Callable[[Engine], None] = lambda e: None

    # events
    def at(self, t: float, kind: str, what: object = None) -> None:
        self._seq += 1
        heapq.heappush(self._events, (t, self._seq, kind, what))

    def timer(self, t: float) -> None:
        if t not in self._timers:
            self._timers.add(t)
            self.at(t, "timer", t)

    def run(self, trace: Sequence[Arrival], step: Callable[[], None]) -> None:
        for a in trace:
            self.at(a.at, "arrive", Req(a.preset, a.at, a.service))
        while self._events:
            t, _, kind, what = heapq.heappop(self._events)
            self._account(t)
            self.now = t
            if kind == "arrive":
                assert isinstance(what, Req)
                self.pending[what.preset].append(what)
                self._seen(what.preset, t)
            elif kind == "end":
                assert isinstance(what, tuple)
                self._end(*what)
            elif kind == "loaded":
                assert isinstance(what, Engine)
                self._loaded(what)
            else:
                self._timers.discard(t)
            step()

    def _seen(self, preset: str, t: float) -> None:
        """A request's arrival, in the mean interval between a preset's requests (what a
        gateway sees of its clients: an exponentially weighted mean, 0.3 to the newest)."""
        last = self.last_arrival.get(preset)
        self.last_arrival[preset] = t
        if last is not None:
            old = self.gap.get(preset)
            self.gap[preset] = t - last if old is None else 0.7 * old + 0.3 * (t - last)

    # memory
    def used(self, gpu: str) -> int:
        return sum(e.held.get(gpu, 0) for e in self.engines.values())

    def free(self, gpu: str) -> int:
        return self.gpu_bytes - self.used(gpu)

    def _account(self, t: float) -> None:
        self._area += sum(self.used(g) for g in self.gpus) * (t - self._area_at)
        self._area_at = t

    # engines
    def start(self, preset: str, place: dict[str, int], known: dict[str, int] | None = None
              ) -> Engine:
        """Load ``preset`` with ``place`` (true bytes per GPU); a load that does not fit
        takes what is free and fails at the end of its load time."""
        assert preset not in self.engines, f"{preset} started twice"
        doomed = any(n > self.free(g) for g, n in place.items())
        held = {g: min(n, max(0, self.free(g))) for g, n in place.items()} if doomed else place
        e = Engine(preset, dict(held), dict(known if known is not None else place), doomed)
        self.engines[preset] = e
        self.at(self.now + self.presets[preset].load, "loaded", e)
        self.loading += self.presets[preset].load
        return e

    def stop(self, preset: str) -> None:
        e = self.engines.pop(preset)
        self.stops += 1
        for r in e.queue:
            r.failed = "cut"
        self.failed += e.in_flight   # the requests in service are lost too
        e.queue.clear()
        e.serving = 0

    def _loaded(self, e: Engine) -> None:
        if self.engines.get(e.preset) is not e:
            return
        if e.doomed:
            del self.engines[e.preset]
            self.oom_starts += 1
            q = self.pending[e.preset]
            for r in list(q):
                r.tries += 1
                if r.tries >= MAX_TRIES:
                    r.failed = "out of memory"
                    self.failed += 1
                    q.remove(r)
            return
        self.cold_starts += 1
        e.ready = True
        e.ready_since = e.idle_since = self.now
        self.on_loaded(e)

    # requests
    def serve(self, preset: str, *, head_only: bool = False) -> None:
        """Hand ``preset``'s waiting requests to its ready engine (the oldest only)."""
        e = self.engines.get(preset)
        q = self.pending[preset]
        if e is None or not e.ready:
            return
        while q:
            r = q.popleft()
            e.last_used = self.now
            if e.serving < SLOTS:
                self._begin(e, r)
            else:
                e.queue.append(r)
            if head_only:
                break

    def _begin(self, e: Engine, r: Req) -> None:
        e.serving += 1
        r.begin = self.now
        self.waits.append(self.now - r.arrival)
        self.waited_for.append(r.preset)
        self.at(self.now + r.service, "end", (e, r))

    def _end(self, e: Engine, r: Req) -> None:
        if self.engines.get(e.preset) is not e or r.failed:
            return   # cut with its engine
        e.serving -= 1
        e.last_used = self.now
        if e.queue:
            self._begin(e, e.queue.popleft())
        elif e.serving == 0:
            e.idle_since = self.now

    def oldest(self) -> list[str]:
        """The presets with waiting requests, the one waiting longest first."""
        return sorted((p for p, q in self.pending.items() if q),
                      key=lambda p: self.pending[p][0].arrival)

    def result(self, rule: str, n: int) -> Result:
        span = max(self._area_at, 1e-9)
        return Result(rule, n, self.cold_starts, self.oom_starts, self.failed, self.stops,
                      tuple(self.waits), self._area / span / GIB,
                      sum(len(q) for q in self.pending.values()),
                      waited_for=tuple(self.waited_for), loading=self.loading)


def main() -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--requests", type=int, default=10000)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--rate", type=float, default=1.5, help="base arrivals per second")
    args = ap.parse_args()
    trace = make_trace(args.requests, args.seed, args.rate)
    per = Counter(a.preset for a in trace)
    print(f"{len(trace)} requests over {trace[-1].at:.0f} s, seed {args.seed}")
    for name, gib in PRESETS:
        p = presets_of()[name]
        print(f"  {name:18} {gib:5.1f} GiB  load {p.load:4.1f} s  "
              f"{100.0 * per[name] / len(trace):5.1f} % of the requests")
    return 0


if __name__ == "__main__":
    sys.exit(main())
