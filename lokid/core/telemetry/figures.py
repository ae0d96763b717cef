"""Requests of one engine start → the figures an operator reads (pure): counts, speeds
over sliding windows, draft acceptance, and what the load said.

Two ways in, one shape out (:data:`KEYS`): :class:`StartStats` follows a running
start, request by request, and keeps only what its windows need (the last
:data:`WINDOW` seconds of requests, compacted, plus running totals since the start),
so an engine that runs for months holds a few minutes of records; :func:`summarize`
computes the same figures over a past window (``lokictl stats --since``, which
re-reads the journal), where "since start" means the whole window.

The figures:

- speeds (``prefill_tps``, ``decode_tps``) are token-weighted, as llama-server's own
  "tokens per second" is: sum of tokens / sum of milliseconds × 1000 over the
  requests of the window (``1m``, ``5m``; ``all`` since the start), so one long
  request weighs what it cost, not what one short one does. ``p50``/``p95`` are
  percentiles of the per-request speeds over the last 5 minutes (linear between
  ranks); a request with no tokens or no time in that phase (a fully cached prompt)
  has no speed and is left out of them;
- a window is the requests whose ``at`` is at most 60 (300) s before ``now``;
  ``requests_per_min`` is the count of the last 60 s, not a rate extrapolated from
  a shorter uptime;
- ``draft`` is None when no request printed a draft line; ``acceptance`` is
  accepted / generated draft tokens since the start, ``mean_len`` the mean of the
  requests' mean accepted length (llama.cpp: 1 + accepted / verification steps);
- ``memory_mib`` ("DEVICE kind" → MiB) and ``offload`` ("N/M", the model's then a
  draft's) come from the engine's load lines, printed at ``-lv 4`` only: None when
  it printed none (unknown, not zero);
- ``on_cpu`` says why the start runs on the CPU although its engine has a GPU backend
  or says it offloaded (issue 44, item 3: a GPU backend that did not start, or
  "offloaded" with host buffers only), None when nothing says so.

Any figure that cannot be computed (no request in the window, no load given) is None.
"""

from __future__ import annotations

from bisect import bisect_left, insort
from collections import deque
from collections.abc import Iterable
from typing import Any, NamedTuple

from .requestlog import Load, Request

WINDOW = 300.0          # seconds of requests kept: the longest window
MINUTE = 60.0
# Records kept at most, whatever the request rate (≈ 330 requests/s over 5 minutes,
# ~10 MB): beyond, the oldest go and the 5-minute figures cover fewer than 5 minutes.
MAX_RECENT = 100_000

KEYS = ("requests", "requests_per_min", "prompt_tokens", "generated_tokens", "prefill_tps",
        "decode_tps", "draft", "in_flight", "load_seconds", "memory_mib", "offload", "on_cpu")


class _Rec(NamedTuple):
    """What the windows need of one request (a Request without its identity; its
    milliseconds as integer microseconds)."""

    at: float
    prompt_tokens: int
    prompt_us: int
    gen_tokens: int
    gen_us: int
    accepted: int | None
    generated: int | None


class _Totals:
    """Running sums since the start."""

    __slots__ = ("requests", "prompt_tokens", "prompt_ms", "gen_tokens", "gen_ms",
                 "draft_requests", "accepted", "generated", "mean_len_sum", "mean_len_n")

    def __init__(self) -> None:
        self.requests = self.prompt_tokens = self.gen_tokens = 0
        self.prompt_ms = self.gen_ms = 0.0
        self.draft_requests = self.accepted = self.generated = 0
        self.mean_len_sum = 0.0
        self.mean_len_n = 0

    def add(self, r: Request) -> None:
        self.requests += 1
        self.prompt_tokens += r.prompt_tokens
        self.prompt_ms += r.prompt_ms
        self.gen_tokens += r.gen_tokens
        self.gen_ms += r.gen_ms
        if r.draft_accepted is not None and r.draft_generated is not None:
            self.draft_requests += 1
            self.accepted += r.draft_accepted
            self.generated += r.draft_generated
        if r.mean_len is not None:
            self.mean_len_sum += r.mean_len
            self.mean_len_n += 1


class _Window:
    """The requests of the last ``span`` seconds, in time order, with their sums kept as
    requests come and go: a snapshot costs what expired since the last one, not a pass
    over every request held. Milliseconds are summed as integer microseconds (the engine
    prints two decimals), so the sums stay exact however long they run, and a running
    start and :func:`summarize` over the same requests agree to the last bit.
    ``speeds``: also the sorted per-request prefill and decode speeds (for p50, p95)."""

    __slots__ = ("span", "recs", "prompt_tokens", "prompt_us", "gen_tokens", "gen_us",
                 "accepted", "generated", "prefill", "decode", "speeds")

    def __init__(self, span: float, speeds: bool) -> None:
        self.span = span
        self.speeds = speeds
        self.recs: deque[_Rec] = deque()
        self.prompt_tokens = self.prompt_us = self.gen_tokens = self.gen_us = 0
        self.accepted = self.generated = 0
        self.prefill: list[float] = []
        self.decode: list[float] = []

    def add(self, r: _Rec) -> None:
        recs = self.recs
        if recs and r.at < recs[-1].at:  # a late one: in its place (from the right)
            i = len(recs)
            while i and recs[i - 1].at > r.at:
                i -= 1
            recs.insert(i, r)
        else:
            recs.append(r)
        self._count(r, 1)
        if len(recs) > MAX_RECENT:
            self._count(recs.popleft(), -1)

    def fill(self, recs: list[_Rec]) -> None:
        """Hold ``recs`` (in time order; the window empty before): sums once, one sort of
        the speeds, not an insertion each."""
        speeds, self.speeds = self.speeds, False
        for r in recs[-MAX_RECENT:]:
            self.recs.append(r)
            self._count(r, 1)
        self.speeds = speeds
        if speeds:
            self.prefill = sorted(r.prompt_tokens / r.prompt_us * 1e6 for r in self.recs
                                  if r.prompt_tokens > 0 and r.prompt_us > 0)
            self.decode = sorted(r.gen_tokens / r.gen_us * 1e6 for r in self.recs
                                 if r.gen_tokens > 0 and r.gen_us > 0)

    def drop_before(self, horizon: float) -> None:
        recs = self.recs
        while recs and recs[0].at < horizon:
            self._count(recs.popleft(), -1)
        if not recs:  # exact zeros (the sums are exact anyway; the speed lists too)
            self.prompt_tokens = self.prompt_us = self.gen_tokens = self.gen_us = 0
            self.accepted = self.generated = 0

    def _count(self, r: _Rec, sign: int) -> None:
        self.prompt_tokens += sign * r.prompt_tokens
        self.prompt_us += sign * r.prompt_us
        self.gen_tokens += sign * r.gen_tokens
        self.gen_us += sign * r.gen_us
        if r.accepted is not None and r.generated is not None:
            self.accepted += sign * r.accepted
            self.generated += sign * r.generated
        if self.speeds:
            for speeds, tokens, us in ((self.prefill, r.prompt_tokens, r.prompt_us),
                                       (self.decode, r.gen_tokens, r.gen_us)):
                if tokens > 0 and us > 0:
                    speed = tokens / us * 1e6
                    if sign > 0:
                        insort(speeds, speed)
                    else:
                        del speeds[bisect_left(speeds, speed)]


def _rec(r: Request) -> _Rec:
    return _Rec(r.at, r.prompt_tokens, round(r.prompt_ms * 1000), r.gen_tokens,
                round(r.gen_ms * 1000), r.draft_accepted, r.draft_generated)


class StartStats:
    """The figures of one start of one preset, fed its requests as they complete.

    ``started`` is the start's time (kept for the caller); ``draft_kind`` what a draft
    line counts for, from the start's plan: "mtp", "ngram", "draft", "mtp+ngram" or ""."""

    def __init__(self, started: float, draft_kind: str = "") -> None:
        self.started = started
        self.draft_kind = draft_kind
        self._totals = _Totals()
        self._last1 = _Window(MINUTE, speeds=False)
        self._last5 = _Window(WINDOW, speeds=True)
        self._latest = float("-inf")   # the newest request's time, or the latest snapshot's

    def add(self, r: Request) -> None:
        self._totals.add(r)
        rec = _rec(r)
        self._last1.add(rec)
        self._last5.add(rec)
        # Forget what no window can need any more, measured from the newest request (the
        # requests arrive in about their order; a late one is dropped at the next add).
        self._latest = max(self._latest, r.at)
        self._last1.drop_before(self._latest - MINUTE)
        self._last5.drop_before(self._latest - WINDOW)

    @property
    def held(self) -> int:
        """How many requests the windows hold now (the memory bound)."""
        return len(self._last5.recs)

    def snapshot(self, now: float, load: Load | None = None,
                 in_flight: int = 0) -> dict[str, Any]:
        """The figures at ``now`` (a JSON-able dict with exactly :data:`KEYS`)."""
        if now < self._latest:
            # Asked of a moment before the newest request or the last snapshot (the wall
            # clock stepped back): a recount of what the windows still hold.
            return summarize_records(self._totals, self._last5.recs, now, self.draft_kind,
                                     load, in_flight)
        self._latest = now
        self._last1.drop_before(now - MINUTE)
        self._last5.drop_before(now - WINDOW)
        return _figures(self._totals, self._last1, self._last5, self.draft_kind, load,
                        in_flight)


def summarize(requests: Iterable[Request], start: float, end: float, draft_kind: str = "",
              load: Load | None = None) -> dict[str, Any]:
    """The figures of the requests completed in ``[start, end]`` (same keys as
    :meth:`StartStats.snapshot`): counts and ``all`` over the whole window, ``1m`` and
    ``5m`` over its last 1 and 5 minutes. ``in_flight`` is None (not known of a past
    window); the load figures come from ``load`` if given."""
    totals = _Totals()
    recent: list[_Rec] = []
    horizon = end - WINDOW
    for r in requests:
        if not start <= r.at <= end:
            continue
        totals.add(r)
        if r.at >= horizon:
            recent.append(_rec(r))
    return summarize_records(totals, recent, end, draft_kind, load, None)


def summarize_records(totals: _Totals, recent: Iterable[_Rec], now: float, draft_kind: str,
                      load: Load | None, in_flight: int | None) -> dict[str, Any]:
    """The figures at ``now`` of windows made afresh from ``recent``."""
    ordered = sorted((r for r in recent if r.at >= now - WINDOW), key=lambda x: x.at)
    last1, last5 = _Window(MINUTE, speeds=False), _Window(WINDOW, speeds=True)
    last5.fill(ordered)
    last1.fill([r for r in ordered if r.at >= now - MINUTE])
    return _figures(totals, last1, last5, draft_kind, load, in_flight)


def _figures(totals: _Totals, last1: _Window, last5: _Window, draft_kind: str,
             load: Load | None, in_flight: int | None) -> dict[str, Any]:
    return {
        "requests": totals.requests,
        "requests_per_min": float(len(last1.recs)),
        "prompt_tokens": totals.prompt_tokens,
        "generated_tokens": totals.gen_tokens,
        "prefill_tps": {"1m": _rate_us(last1.prompt_tokens, last1.prompt_us),
                        "5m": _rate_us(last5.prompt_tokens, last5.prompt_us),
                        "all": _rate(totals.prompt_tokens, totals.prompt_ms),
                        "p50": _percentile(last5.prefill, 0.50),
                        "p95": _percentile(last5.prefill, 0.95)},
        "decode_tps": {"1m": _rate_us(last1.gen_tokens, last1.gen_us),
                       "5m": _rate_us(last5.gen_tokens, last5.gen_us),
                       "all": _rate(totals.gen_tokens, totals.gen_ms),
                       "p50": _percentile(last5.decode, 0.50),
                       "p95": _percentile(last5.decode, 0.95)},
        "draft": _draft(totals, last5, draft_kind),
        "in_flight": in_flight,
        "load_seconds": load.seconds if load is not None else None,
        "memory_mib": ({f"{dev} {kind}": mib for (dev, kind), mib in load.buffers.items()}
                       if load is not None and load.buffers else None),
        "offload": ([f"{n}/{m}" for n, m in load.offloaded]
                    if load is not None and load.offloaded else None),
        "on_cpu": (load.on_cpu() or None) if load is not None else None,
    }


def _rate_us(tokens: int, us: int) -> float | None:
    return tokens / us * 1e6 if us > 0 else None


def _rate(tokens: int, ms: float) -> float | None:
    return tokens / ms * 1000.0 if ms > 0 else None


def _percentile(ordered: list[float], q: float) -> float | None:
    """The q-quantile of sorted values, linear between the closest ranks (numpy's
    default); None of nothing."""
    if not ordered:
        return None
    pos = q * (len(ordered) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def _draft(totals: _Totals, last5: _Window, kind: str) -> dict[str, Any] | None:
    if totals.draft_requests == 0:
        return None
    return {
        "kind": kind,
        "accepted": totals.accepted,
        "generated": totals.generated,
        "acceptance": totals.accepted / totals.generated if totals.generated else None,
        "acceptance_5m": last5.accepted / last5.generated if last5.generated else None,
        "mean_len": totals.mean_len_sum / totals.mean_len_n if totals.mean_len_n else None,
    }
