#!/usr/bin/env python3
"""Placement on 2 × 80 GiB GPUs, trace-driven: lokid's rule beside the peers' (issues 29, 47).

What it measures: one seeded trace of requests over 10 presets (4.4 to 69.7 GiB, 251 GiB
in all; Zipf popularity, Poisson arrivals at 1.5/s plus bursts of 40 requests for a rare
preset; :mod:`placement_host`), replayed through each rule on the same simulated host by
a discrete-event simulation on a simulated clock (nothing sleeps, no engine runs). Per
rule: cold starts (loads that completed) and out-of-memory starts (loads that did not
fit) per 1,000 requests, and the GPU seconds spent loading per 1,000; the wait of a
request (its arrival → the start of its service) at p50, p95 and its longest; the failed
requests (cut by an eviction, refused, or given up after :data:`MAX_TRIES` failed
loads), the mean memory in use and the engines stopped. Then lokid's cold starts against
the fewest of a peer, each lokid row's p95 wait against the best peer's, which presets
the 5 % of requests that waited longest were for, and the time of one :func:`decide` for
50 presets on 8 devices. Goals: fewer cold starts than every peer at 0 out-of-memory
starts, a decision in at most 1 ms (issue 29); the tail wait at the best peer's, or the
trade shown (issue 47).

The rules, on the same trace (each peer's configuration, and why it is its best:
:mod:`placement_peers`):

- **lokid**: :func:`lokid.core.place.policy.decide`, called at every event (an arrival,
  the end of a request, a load done, the timer its plan's ``again_at`` asks for), with
  the devices, residents and waiting presets built from the simulated state; the
  simulator does what the plan says (the gateway's part): a start loads for its load
  time (the engine is ``starting`` until then), an eviction stops the engine at once (a
  ``cut`` one loses its requests: counted as failed), a hold keeps the requests waiting,
  and a request for an engine in ``Plan.closing`` waits instead of being served. lokid
  knows a preset's footprint once it has loaded it (measured: the true one); before,
  its estimate is the true footprint × a factor drawn once per preset in [1.0, 1.1]. A
  load's measured time is its ``cost``; before it was measured, the gateway's estimate
  from that need (:func:`lokid.core.serve.swaps.estimated_cost`).
- **lokid, RENT 8** and **RENT 4**: the same rule with ``policy.RENT`` lowered for the
  run (:func:`rent`; the rule's is 28): what its tail wait costs in cold starts.
- **llama-swap groups**: six models kept together on GPU0, the four big ones in a swap
  group on GPU1; **llama-swap matrix**: models pinned to the GPUs as searched, every
  fitting set allowed, an eviction holding the one lock until every request in flight
  ends (its code); **(evicted)**: the same, waiting for the evicted models only.
- **router --models-max 2, 3, 4**: llama.cpp's router, LRU by count, no memory.
- **Ollama, exact estimate** (its own engine's measured allocations) and **errors from
  its issues** (the llama.cpp engine's estimate, × a ratio reported in its issues, fixed
  per model); LRU idle engines evicted until the estimate fits, its pending queue served
  one request at a time.

Run (20–22 s for the default run on this machine's 2 shared CPUs at load 4–6)::

    .venv/bin/python benchmarks/placement_sim.py [--requests 10000] [--seed 1]
                                                 [--rate 1.5] [--quick] [--tune]

``--quick``: 2,000 requests; ``--tune``: search llama-swap's pinning again first (51 s).
The figures it printed here (2 CPUs, Python 3.11), seed 1 then seed 2::

    10000 requests, seed 1, 1.5/s plus bursts, 6478 s simulated, replayed in 19.5 s
    | rule | cold | OOM | load s | p50 s | p95 s | max s | failed | GiB | stops |
    |---|---|---|---|---|---|---|---|---|---|
    | lokid | 46.0 | 0.0 | 557 | 6.6 | 79.1 | 281.0 | 0 | 150 | 453 |
    | lokid, RENT 8 | 63.9 | 0.0 | 731 | 3.2 | 53.1 | 114.1 | 0 | 150 | 634 |
    | lokid, RENT 4 | 70.5 | 0.0 | 816 | 0.8 | 48.4 | 97.5 | 0 | 148 | 700 |
    | llama-swap groups | 170.3 | 0.0 | 3562 | 0.0 | 27194 | 33841 | 0 | 126 | 1696 |
    | llama-swap matrix | 212.9 | 0.0 | 2773 | 13356 | 24986 | 26308 | 0 | 146 | 2124 |
    | llama-swap matrix (evicted) | 212.9 | 0.0 | 2773 | 6084 | 11891 | 12509 | 0 | 145 | 2124 |
    | router --models-max 2 | 52.0 | 0.0 | 614 | 49.1 | 104.3 | 144.1 | 0 | 59 | 518 |
    | router --models-max 3 | 94.1 | 4.4 | 1167 | 24.3 | 60.0 | 108.1 | 0 | 94 | 938 |
    | router --models-max 4 | 122.1 | 25.7 | 1763 | 16.5 | 54.6 | 124.5 | 80 | 120 | 1217 |
    | Ollama, exact estimate | 170.8 | 0.0 | 1793 | 9.3 | 33.0 | 56.3 | 0 | 129 | 1701 |
    | Ollama, errors from its issues | 103.3 | 2.1 | 1154 | 23.2 | 59.5 | 96.7 | 0 | 90 | 1031 |
    cold, OOM: cold and out-of-memory starts per 1,000 requests; load s: GPU
    seconds spent loading (failed loads too) per 1,000 requests; p50, p95, max:
    the waits; failed: cut, refused or given up; GiB: the mean in use over the
    run, both GPUs; stops: swaps and evictions
    lokid's cold starts / the best peer's (router --models-max 2): 0.88
    goal (fewer cold starts than every peer, 0 OOM starts): met
    the best p95 wait of a peer: Ollama, exact estimate, 33.0 s; each lokid row's
    p95 / that, and its cold starts / the fewest of a peer's:
      lokid: 2.39, 0.88
      lokid, RENT 8: 1.61, 1.23
      lokid, RENT 4: 1.47, 1.36
    the 5 % of requests that waited longest were for:
      lokid: qwen2.5-72b-q6 (272) and llama3.3-70b-q4 (99) of 500
      Ollama, exact estimate: qwen2.5-72b-q6 (297) and llama3.3-70b-q4 (89) of 500
    lokid's holds at their own again_at with no later one, where 1 ms later the rule
    would start or evict: 0
    decide(), 50 presets on 8 GPUs, 10 resident and 10 waiting, 2000 calls:
    median 326 µs, p99 4655 µs (goal ≤ 1000 µs)

    10000 requests, seed 2, 1.5/s plus bursts, 6290 s simulated, replayed in 22.4 s
    | rule | cold | OOM | load s | p50 s | p95 s | max s | failed | GiB | stops |
    |---|---|---|---|---|---|---|---|---|---|
    | lokid | 46.2 | 0.0 | 554 | 8.2 | 78.3 | 169.1 | 0 | 149 | 457 |
    | lokid, RENT 8 | 62.8 | 0.0 | 738 | 3.0 | 52.4 | 114.4 | 0 | 149 | 622 |
    | lokid, RENT 4 | 72.1 | 0.0 | 815 | 1.2 | 45.7 | 106.8 | 0 | 149 | 716 |
    | llama-swap groups | 170.3 | 0.0 | 3582 | 0.0 | 26917 | 34180 | 0 | 126 | 1696 |
    | llama-swap matrix | 214.8 | 0.0 | 2852 | 13862 | 25864 | 27440 | 0 | 146 | 2142 |
    | llama-swap matrix (evicted) | 214.8 | 0.0 | 2852 | 7057 | 13090 | 13939 | 0 | 144 | 2142 |
    | router --models-max 2 | 48.4 | 0.0 | 574 | 52.0 | 108.8 | 150.0 | 0 | 58 | 482 |
    | router --models-max 3 | 87.6 | 5.4 | 1124 | 25.6 | 62.2 | 131.6 | 0 | 95 | 873 |
    | router --models-max 4 | 114.7 | 25.9 | 1690 | 17.9 | 53.3 | 121.2 | 137 | 120 | 1143 |
    | Ollama, exact estimate | 165.1 | 0.0 | 1735 | 10.0 | 34.1 | 60.9 | 0 | 127 | 1646 |
    | Ollama, errors from its issues | 109.6 | 6.0 | 1278 | 19.7 | 59.9 | 108.4 | 0 | 98 | 1094 |
    cold, OOM: cold and out-of-memory starts per 1,000 requests; load s: GPU
    seconds spent loading (failed loads too) per 1,000 requests; p50, p95, max:
    the waits; failed: cut, refused or given up; GiB: the mean in use over the
    run, both GPUs; stops: swaps and evictions
    lokid's cold starts / the best peer's (router --models-max 2): 0.95
    goal (fewer cold starts than every peer, 0 OOM starts): met
    the best p95 wait of a peer: Ollama, exact estimate, 34.1 s; each lokid row's
    p95 / that, and its cold starts / the fewest of a peer's:
      lokid: 2.30, 0.95
      lokid, RENT 8: 1.54, 1.30
      lokid, RENT 4: 1.34, 1.49
    the 5 % of requests that waited longest were for:
      lokid: qwen2.5-72b-q6 (281) and llama3.3-70b-q4 (82) of 500
      Ollama, exact estimate: qwen2.5-72b-q6 (299) and llama3.3-70b-q4 (69) of 500
    lokid's holds at their own again_at with no later one, where 1 ms later the rule
    would start or evict: 0
    decide(), 50 presets on 8 GPUs, 10 resident and 10 waiting, 2000 calls:
    median 347 µs, p99 7558 µs (goal ≤ 1000 µs)

What they say:

- lokid keeps its lead where issue 29 put it: the fewest cold starts (46.0 and 46.2 per
  1,000 requests: 0.88 and 0.95 × the router's at ``--models-max 2``, the fewest of a
  peer), no out-of-memory start, no failed request, and the fewest GPU seconds spent
  loading (557 and 554 per 1,000; the router at 2: 614 and 574; Ollama with an exact
  estimate: 1,793 and 1,735).
- Its tail is worse than four peer rows': a p95 wait of 79.1 and 78.3 s where Ollama
  with an exact estimate waits 33.0 and 34.1 s (2.39 and 2.30 ×), the router at 4 and 3
  54.6, 53.3, 60.0 and 62.2 s (with 25.7–25.9 and 4.4–5.4 out-of-memory starts per
  1,000, and 80 and 137 failed requests at 4), Ollama with its issues' errors 59.5 and
  59.9 s (2.1 and 6.0 out-of-memory starts per 1,000). Only the router at 2 (104.3 and
  108.8 s) and llama-swap wait longer. Its median (6.6 and 8.2 s) is shorter than every
  peer's but llama-swap's groups.
- The tail is the 70 GiB preset: 272 and 281 of the 500 requests that waited longest
  were for qwen2.5-72b-q6 (11 % of the requests), which needs a GPU all but emptied.
  lokid starts it once the waits of its requests have paid the rent of every engine in
  the way (RENT times each one's load) and those engines have drained; Ollama evicts
  them at once, and its slowest requests are for the same preset (297 and 299 of 500),
  its p95 (33.0 and 34.1 s) about that preset's 29.9 s load.
- The trade, side by side: a lower rent moves lokid along one curve. RENT 8: 63.9 and
  62.8 cold starts, p95 53.1 and 52.4 s; RENT 4: 70.5 and 72.1, p95 48.4 and 45.7 s. No
  point of it reaches Ollama's 33–34 s, and each below 28 loses the cold-start lead to
  the router at 2 (52.0 and 48.4). A grid on seed 1 (RENT 28, 16, 8 × DECAY 8, 2 ×
  GAP_FACTOR 4, 1, the module's constants set as :func:`rent` sets RENT; an ad-hoc run,
  not part of this script) found the same curve: its best p95 was 47.4 s at 74.7 cold
  starts, and only RENT 28 with DECAY 8 kept cold starts below the router's 52.0 (46.0,
  and 49.7 at GAP_FACTOR 1 with a p95 of 77.9 s). So the tail goal is not met by the
  rule: at RENT 28 lokid buys the fewest loads (0.31–0.32 × Ollama's GPU seconds of
  loading) and a shorter median than every peer but llama-swap's groups, with a p95
  2.3–2.4 × the best peer's. The best peer is the kindest case for Ollama: the exact
  estimate holds for models on its own engine only; with the llama.cpp engine (what
  lokid runs) its p95 is 59.5–59.9 s with out-of-memory starts, which lokid at RENT 8
  beats on p95, p50 and cold starts, with no out-of-memory start.
- llama-swap falls behind the arrivals in both configurations here: its groups serve
  GPU0's 73 % of the requests at once (p50 0.0 s), but the swap group on GPU1 swaps at
  each change of model in arrival order and its queue grows for the whole run; the
  matrix evicts for each request of a model not running (213–215 cold starts per 1,000),
  and each eviction holds the one lock until every request in flight has ended; waiting
  for the evicted models only halves the waits, no more. At ``--rate 0.5`` (seed 1) the
  (evicted) matrix's p95 is 679.5 s (its longest 765.3 s), the code's 12,958 s.

What the first version (issue 29) printed instead: llama-swap as one group on one GPU,
791.2 and 791.8 cold starts per 1,000; Ollama with an estimate drawn per load within
±25 %, 198 and 192 out-of-memory starts in 10,000 requests and 91 and 35 failed. With
the errors its issues report, fixed per model, 21 and 60 in 10,000 and none failed.

The decision's median time is 0.3 ms, within its goal; its p99 on this loaded machine
(load 4–6, a test suite running beside) ran from 0.40 to 12.3 ms between ten runs of
the same code: within noise of the goal here (issue 29's quieter runs: p99 0.35 ms).
"""

# No "from __future__ import annotations": the dataclasses here must not look their module
# up in sys.modules (tests/packaging/test_scripts_import.py loads this file without one).
import argparse
import math
import random
import statistics
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path

from lokid.core.place import policy
from lokid.core.place.policy import GIB, Device, Need, Resident, Waiting, decide
from lokid.core.serve.swaps import NEVER, estimated_cost

sys.path.insert(0, str(Path(__file__).resolve().parent))
from placement_host import (  # noqa: E402
    GPU_BYTES,
    GPUS,
    MAX_TRIES,
    PRESETS,
    Arrival,
    Engine,
    Host,
    Preset,
    Result,
    make_trace,
    presets_of,
)
from placement_peers import (  # noqa: E402
    MATRIX_GPU1,
    OllamaStyle,
    RouterLRU,
    estimate_ratios,
    llama_swap_groups,
    llama_swap_matrix,
)

# what tests/bench/test_placement_sim.py and benchmarks/placement_systemd.py take from here
__all__ = ["GIB", "MAX_TRIES", "RULES", "Arrival", "Host", "OllamaStyle", "Preset", "Result",
           "make_trace", "presets_of", "simulate"]


# --- lokid's rule ----------------------------------------------------------------------

class Lokid:
    """lokid's rule: :func:`decide` at each event, its plan carried out."""

    def __init__(self, host: Host, seed: int) -> None:
        rng = random.Random(f"lokid-estimate-{seed}")
        self.host = host
        self.estimate = {p.name: int(p.footprint * rng.uniform(1.0, 1.1))
                         for p in host.presets.values()}
        self.measured: dict[str, float] = {}   # its load, seconds
        self.closing: frozenset[str] = frozenset()
        self.closed_since: dict[str, float] = {}   # since when each is closed, unbroken
        self.devices = [Device(g, host.gpu_bytes) for g in host.gpus]
        self.refused = 0
        # decisions made at the time a plan's again_at asked for that still hold and ask
        # for no later time, where the same decision 1 ms later starts or evicts: the
        # requests then wait for an unrelated event (a rounding edge of the policy)
        self.stalls = 0
        self._asked: set[float] = set()
        host.on_loaded = self._measure

    def _measure(self, e: Engine) -> None:
        self.estimate[e.preset] = e.held[next(iter(e.held))]
        self.measured[e.preset] = self.host.presets[e.preset].load
        e.known = dict(e.held)

    def cost(self, preset: str) -> float:
        """Its load as measured; before, the gateway's estimate from its need
        (lokid.gateway.groups.swap_cost)."""
        got = self.measured.get(preset)
        return estimated_cost(self.estimate[preset]) if got is None else got

    def _serve(self) -> None:
        for preset in self.host.oldest():
            if preset not in self.closing:
                self.host.serve(preset)

    def __call__(self) -> None:
        h = self.host
        self._serve()
        for _ in range(len(h.presets) + 1):   # each round stops at least one engine
            plan = decide(self.devices, self.residents(), self.waiting(), h.now)
            self.closing = plan.closing
            self.closed_since = {p: self.closed_since.get(p, h.now) for p in plan.closing}
            for refusal in plan.refusals:
                q = h.pending[refusal.preset]
                self.refused += len(q)
                h.failed += len(q)
                q.clear()
            for ev in plan.evictions:
                assert ev.cut or h.engines[ev.preset].in_flight == 0, ev
                h.stop(ev.preset)
            for st in plan.starts:
                true = h.presets[st.preset].footprint
                h.start(st.preset, {st.devices[0]: true},
                        {st.devices[0]: self.estimate[st.preset]})
            if not plan.evictions:
                break
        if (h.now in self._asked and plan.holds and not plan.starts
                and not plan.evictions and plan.again_at is None):
            later = decide(self.devices, self.residents(), self.waiting(), h.now + 1e-3)
            if later.starts or later.evictions:   # only the time it asked for was short
                self.stalls += 1
        self._asked.discard(h.now)
        if plan.again_at is not None:
            self._asked.add(plan.again_at)
            h.timer(plan.again_at)
        self._serve()

    def residents(self) -> list[Resident]:
        return [Resident(e.preset, e.known, in_flight=e.in_flight, ready_since=e.ready_since,
                         idle_since=e.idle_since, last_used=e.last_used,
                         cost=self.cost(e.preset), starting=not e.ready,
                         gap=self.host.gap.get(e.preset), closing=e.preset in self.closing,
                         closed_since=self.closed_since.get(e.preset, NEVER))
                for e in self.host.engines.values()]

    def waiting(self) -> list[Waiting]:
        h = self.host
        return [Waiting(Need(p, per_gpu=self.estimate[p], count=1, cost=self.cost(p)),
                        since=q[0].arrival, count=len(q),
                        waited=sum(h.now - r.arrival for r in q))
                for p, q in h.pending.items() if q]


@contextmanager
def rent(value: float) -> Iterator[None]:
    """lokid's rule with another :data:`lokid.core.place.policy.RENT` (a variant shown
    beside the rule: what its tail wait costs in cold starts)."""
    old = policy.RENT
    policy.RENT = value
    try:
        yield
    finally:
        policy.RENT = old


# --- the rules, side by side ----------------------------------------------------------

RULES = ("lokid", "lokid, RENT 8", "lokid, RENT 4", "llama-swap groups", "llama-swap matrix",
         "llama-swap matrix (evicted)", "router --models-max 2", "router --models-max 3",
         "router --models-max 4", "Ollama, exact estimate", "Ollama, errors from its issues")


def simulate(rule: str, trace: Sequence[Arrival], seed: int,
             presets: dict[str, Preset] | None = None, gpus: Sequence[str] = GPUS,
             gpu_bytes: int = GPU_BYTES, matrix_gpu1: frozenset[str] = MATRIX_GPU1) -> Result:
    """Replay ``trace`` through ``rule`` (one of :data:`RULES`) on a fresh host."""
    host = Host(presets if presets is not None else presets_of(), gpus, gpu_bytes)
    step: Callable[[], None]
    rent_value = policy.RENT
    if rule == "lokid" or rule.startswith("lokid, RENT "):
        step = Lokid(host, seed)
        if rule != "lokid":
            rent_value = float(rule.rsplit(" ", 1)[1])
    elif rule.startswith("llama-swap matrix"):
        step = llama_swap_matrix(host, matrix_gpu1, drain_all=rule == "llama-swap matrix")
    elif rule == "llama-swap groups":
        step = llama_swap_groups(host)
    elif rule.startswith("router --models-max "):
        step = RouterLRU(host, int(rule.rsplit(" ", 1)[1]))
    elif rule == "Ollama, exact estimate":
        step = OllamaStyle(host)
    elif rule == "Ollama, errors from its issues":
        step = OllamaStyle(host, estimate_ratios(list(host.presets), seed))
    else:
        raise ValueError(f"unknown rule {rule!r}; one of {', '.join(RULES)}")
    with rent(rent_value):
        host.run(trace, step)
    result = host.result(rule, len(trace))
    if isinstance(step, Lokid):
        result = replace(result, stalls=step.stalls)
    return result


def tune(rate: float, requests: int = 2000, seed: int = 101) -> frozenset[str]:
    """The pinning of models to GPUs that gives llama-swap's matrix (its evicted-drain
    variant) its lowest p95 wait, then fewest cold starts, on a calibration trace of its
    own seed: all 512 (the first model on GPU0)."""
    trace = make_trace(requests, seed, rate)
    names = [name for name, _ in PRESETS]
    best: tuple[float, int] | None = None
    chosen: frozenset[str] = frozenset()
    for mask in range(2 ** (len(names) - 1)):
        gpu1 = frozenset(n for i, n in enumerate(names[1:]) if mask >> i & 1)
        r = simulate("llama-swap matrix (evicted)", trace, seed, matrix_gpu1=gpu1)
        if r.unserved or r.failed:
            continue
        key = (r.wait(0.95), r.cold_starts)
        if best is None or key < best:
            best, chosen = key, gpu1
    return chosen


# --- the decision's time ---------------------------------------------------------------

# --- the decision's time ---------------------------------------------------------------

def time_decide(calls: int = 2000, seed: int = 1) -> tuple[float, float]:
    """Median and p99 µs of one :func:`decide`: 50 presets of 4–70 GiB on 8 GPUs of 80 GiB,
    up to 10 of them resident (idle or busy, each on the GPU with the most room, where it
    fits), 10 waiting (the other 30 are neither, and a decision never sees them); 100 such states
    drawn at random, each decided ``calls / 100`` times."""
    rng = random.Random(f"decide-{seed}")
    devices = [Device(f"GPU{i}", GPU_BYTES) for i in range(8)]
    states = []
    for _ in range(100):
        sizes = {f"p{i:02d}": int(rng.uniform(4, 70) * GIB) for i in range(50)}
        names = rng.sample(sorted(sizes), 20)
        free = {d.name: d.total for d in devices}
        residents = []
        for name in names[:10]:
            gpu = max(free, key=lambda g: free[g])
            if free[gpu] < sizes[name]:
                continue
            free[gpu] -= sizes[name]
            busy = rng.random() < 0.5
            residents.append(Resident(name, {gpu: sizes[name]}, in_flight=2 if busy else 0,
                                      ready_since=rng.uniform(0, 50),
                                      idle_since=rng.uniform(50, 90),
                                      last_used=rng.uniform(50, 90), cost=rng.uniform(3, 30)))
        waiting = [Waiting(Need(name, per_gpu=sizes[name], count=1, cost=rng.uniform(3, 30)),
                           since=rng.uniform(60, 100), count=rng.randint(1, 5))
                   for name in names[10:]]
        states.append((residents, waiting))
    times = []
    for i in range(calls):
        residents, waiting = states[i % len(states)]
        t0 = time.perf_counter_ns()
        decide(devices, residents, waiting, 100.0)
        times.append((time.perf_counter_ns() - t0) / 1000.0)
    times.sort()
    return statistics.median(times), times[min(len(times) - 1, int(0.99 * len(times)))]



# --- the report ------------------------------------------------------------------------

def secs(t: float) -> str:
    """A wait for the table: tenths below 1,000 s, whole seconds from there."""
    return f"{t:.1f}" if t < 1000.0 else f"{t:.0f}"


def table(results: Sequence[Result]) -> str:
    head = "| rule | cold | OOM | load s | p50 s | p95 s | max s | failed | GiB | stops |"
    rows = [head, "|" + "---|" * 10]
    for r in results:
        rows.append(f"| {r.rule} | {r.per_1000():.1f} | {r.oom_per_1000():.1f} "
                    f"| {1000.0 * r.loading / r.requests:.0f} "
                    f"| {secs(r.wait(0.5))} | {secs(r.wait(0.95))} | {secs(r.wait(1.0))} "
                    f"| {r.failed} | {r.mean_gib:.0f} | {r.stops} |")
    rows.append("cold, OOM: cold and out-of-memory starts per 1,000 requests; load s: GPU")
    rows.append("seconds spent loading (failed loads too) per 1,000 requests; p50, p95, max:")
    rows.append("the waits; failed: cut, refused or given up; GiB: the mean in use over the")
    rows.append("run, both GPUs; stops: swaps and evictions")
    return "\n".join(rows)


def main() -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--requests", type=int, default=10000)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--rate", type=float, default=1.5, help="base arrivals per second")
    ap.add_argument("--quick", action="store_true", help="2,000 requests")
    ap.add_argument("--calls", type=int, default=2000, help="decide() calls timed")
    ap.add_argument("--tune", action="store_true",
                    help="search llama-swap's pinning of models to GPUs first (seed 101)")
    args = ap.parse_args()
    n = 2000 if args.quick else args.requests
    gpu1 = MATRIX_GPU1
    if args.tune:
        t0 = time.perf_counter()
        gpu1 = tune(args.rate)
        print(f"llama-swap's matrix, pinned to GPU1 ({time.perf_counter() - t0:.0f} s): "
              f"{', '.join(n for n, _ in PRESETS if n in gpu1)}")
    t0 = time.perf_counter()
    trace = make_trace(n, args.seed, args.rate)
    results = [simulate(rule, trace, args.seed, matrix_gpu1=gpu1) for rule in RULES]
    spent = time.perf_counter() - t0
    print(f"{n} requests, seed {args.seed}, {args.rate}/s plus bursts, "
          f"{trace[-1].at:.0f} s simulated, replayed in {spent:.1f} s")
    print(table(results))
    lokid = results[0]
    peers = [r for r in results if not r.rule.startswith("lokid")]
    best = min(peers, key=lambda r: r.cold_starts)
    ratio = lokid.cold_starts / best.cold_starts if best.cold_starts else math.inf
    met = all(lokid.cold_starts < p.cold_starts for p in peers) and lokid.oom_starts == 0
    print(f"lokid's cold starts / the best peer's ({best.rule}): {ratio:.2f}")
    print(f"goal (fewer cold starts than every peer, 0 OOM starts): "
          f"{'met' if met else 'NOT met'}")
    tail = min(peers, key=lambda p: p.wait(0.95))
    print(f"the best p95 wait of a peer: {tail.rule}, {tail.wait(0.95):.1f} s; each lokid row's")
    print("p95 / that, and its cold starts / the fewest of a peer's:")
    for r in results:
        if r.rule.startswith("lokid"):
            print(f"  {r.rule}: {r.wait(0.95) / tail.wait(0.95):.2f}, "
                  f"{r.cold_starts / best.cold_starts:.2f}")
    print("the 5 % of requests that waited longest were for:")
    for r in (lokid, tail):
        top = r.slowest().most_common(2)
        print(f"  {r.rule}: " + " and ".join(f"{p} ({n})" for p, n in top)
              + f" of {sum(r.slowest().values())}")
    if any(r.unserved for r in results):
        print("still waiting at the end: "
              + ", ".join(f"{r.rule} {r.unserved}" for r in results if r.unserved))
    print(f"lokid's holds at their own again_at with no later one, where 1 ms later the rule"
          f"\nwould start or evict: {lokid.stalls}")
    median, p99 = time_decide(args.calls, args.seed)
    print(f"decide(), 50 presets on 8 GPUs, 10 resident and 10 waiting, {args.calls} calls:"
          f"\nmedian {median:.0f} µs, p99 {p99:.0f} µs (goal ≤ 1000 µs)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
