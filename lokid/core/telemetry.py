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
  it printed none (unknown, not zero).

Any figure that cannot be computed (no request in the window, no load given) is None.
"""

from __future__ import annotations

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
        "decode_tps", "draft", "in_flight", "load_seconds", "memory_mib", "offload")


class _Rec(NamedTuple):
    """What the windows need of one request (a Request without its identity)."""

    at: float
    prompt_tokens: int
    prompt_ms: float
    gen_tokens: int
    gen_ms: float
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


class StartStats:
    """The figures of one start of one preset, fed its requests as they complete.

    ``started`` is the start's time (kept for the caller); ``draft_kind`` what a draft
    line counts for, from the start's plan: "mtp", "ngram", "draft", "mtp+ngram" or ""."""

    def __init__(self, started: float, draft_kind: str = "") -> None:
        self.started = started
        self.draft_kind = draft_kind
        self._totals = _Totals()
        self._recent: deque[_Rec] = deque(maxlen=MAX_RECENT)
        self._latest = float("-inf")

    def add(self, r: Request) -> None:
        self._totals.add(r)
        self._recent.append(_Rec(r.at, r.prompt_tokens, r.prompt_ms, r.gen_tokens, r.gen_ms,
                                 r.draft_accepted, r.draft_generated))
        # Forget what no window can need any more, measured from the newest request (the
        # requests arrive in about their order; a late one is dropped at the next add).
        self._latest = max(self._latest, r.at)
        horizon = self._latest - WINDOW
        recent = self._recent
        while recent and recent[0].at < horizon:
            recent.popleft()

    @property
    def held(self) -> int:
        """How many requests the windows hold now (the memory bound)."""
        return len(self._recent)

    def snapshot(self, now: float, load: Load | None = None,
                 in_flight: int = 0) -> dict[str, Any]:
        """The figures at ``now`` (a JSON-able dict with exactly :data:`KEYS`)."""
        return _figures(self._totals, self._recent, now, self.draft_kind, load, in_flight)


def summarize(requests: Iterable[Request], start: float, end: float, draft_kind: str = "",
              load: Load | None = None) -> dict[str, Any]:
    """The figures of the requests completed in ``[start, end]`` (same keys as
    :meth:`StartStats.snapshot`): counts and ``all`` over the whole window, ``1m`` and
    ``5m`` over its last 1 and 5 minutes. ``in_flight`` is None (not known of a past
    window); the load figures come from ``load`` if given."""
    totals = _Totals()
    recent: deque[_Rec] = deque()
    horizon = end - WINDOW
    for r in requests:
        if not start <= r.at <= end:
            continue
        totals.add(r)
        if r.at >= horizon:
            recent.append(_Rec(r.at, r.prompt_tokens, r.prompt_ms, r.gen_tokens, r.gen_ms,
                               r.draft_accepted, r.draft_generated))
    return _figures(totals, recent, end, draft_kind, load, None)


def _figures(totals: _Totals, recent: Iterable[_Rec], now: float, draft_kind: str,
             load: Load | None, in_flight: int | None) -> dict[str, Any]:
    last5 = [r for r in recent if r.at >= now - WINDOW]
    last1 = [r for r in last5 if r.at >= now - MINUTE]
    return {
        "requests": totals.requests,
        "requests_per_min": float(len(last1)),
        "prompt_tokens": totals.prompt_tokens,
        "generated_tokens": totals.gen_tokens,
        "prefill_tps": _speeds([(r.prompt_tokens, r.prompt_ms) for r in last1],
                               [(r.prompt_tokens, r.prompt_ms) for r in last5],
                               totals.prompt_tokens, totals.prompt_ms),
        "decode_tps": _speeds([(r.gen_tokens, r.gen_ms) for r in last1],
                              [(r.gen_tokens, r.gen_ms) for r in last5],
                              totals.gen_tokens, totals.gen_ms),
        "draft": _draft(totals, last5, draft_kind),
        "in_flight": in_flight,
        "load_seconds": load.seconds if load is not None else None,
        "memory_mib": ({f"{dev} {kind}": mib for (dev, kind), mib in load.buffers.items()}
                       if load is not None and load.buffers else None),
        "offload": ([f"{n}/{m}" for n, m in load.offloaded]
                    if load is not None and load.offloaded else None),
    }


def _rate(tokens: int, ms: float) -> float | None:
    return tokens / ms * 1000.0 if ms > 0 else None


def _speeds(last1: list[tuple[int, float]], last5: list[tuple[int, float]],
            all_tokens: int, all_ms: float) -> dict[str, float | None]:
    per_request = sorted(t / ms * 1000.0 for t, ms in last5 if t > 0 and ms > 0)
    return {
        "1m": _rate(sum(t for t, _ in last1), sum(ms for _, ms in last1)),
        "5m": _rate(sum(t for t, _ in last5), sum(ms for _, ms in last5)),
        "all": _rate(all_tokens, all_ms),
        "p50": _percentile(per_request, 0.50),
        "p95": _percentile(per_request, 0.95),
    }


def _percentile(ordered: list[float], q: float) -> float | None:
    """The q-quantile of sorted values, linear between the closest ranks (numpy's
    default); None of nothing."""
    if not ordered:
        return None
    pos = q * (len(ordered) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def _draft(totals: _Totals, last5: list[_Rec], kind: str) -> dict[str, Any] | None:
    if totals.draft_requests == 0:
        return None
    accepted5 = generated5 = 0
    for r in last5:
        if r.accepted is not None and r.generated is not None:
            accepted5 += r.accepted
            generated5 += r.generated
    return {
        "kind": kind,
        "accepted": totals.accepted,
        "generated": totals.generated,
        "acceptance": totals.accepted / totals.generated if totals.generated else None,
        "acceptance_5m": accepted5 / generated5 if generated5 else None,
        "mean_len": totals.mean_len_sum / totals.mean_len_n if totals.mean_len_n else None,
    }
