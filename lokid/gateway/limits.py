"""A key's rate limits and token budgets, checked when a request is admitted (issue 46, item 4).

A named key (:class:`lokid.core.serve.keys.Limits`) may have ``requests_per_minute``,
``tokens_per_minute``, ``tokens_per_day`` and ``tokens_per_month``. :meth:`Limiter.check`
runs once per request, after its key and its model are known and before anything is
started, sent to an engine or to a peer; past a limit the answer is 429 in OpenAI's
error shape: ``rate_limit_exceeded`` (type ``requests`` or ``tokens``, as OpenAI sends
them) for a per-minute rate, ``insufficient_quota`` for a day's or a month's budget, the
message naming the key, the limit, what was used and when it frees (UTC), and a
``Retry-After`` header in seconds. Rules, each for a failure it prevents:

- a per-minute rate is a sliding window of 60 one-second buckets per key
  (:class:`Window`): a fixed minute would let a client send twice its rate across a
  minute's edge, and a list of every request's time would grow with the rate (a key of
  10^6 requests a minute would hold 10^6 floats); 60 counters are the bound, whatever
  the rate. A request is counted when it is admitted, whatever its answer (a request
  refused here is not: a client retrying on 429 does not push its own next slot away);
- tokens are known only at a request's end (the engine's own figures,
  :mod:`lokid.gateway.usage`, through :meth:`Limiter.spent`): the check at admission sees
  what ended before. A request admitted under a limit runs to its end, and the requests
  in flight together may pass a limit or a budget by what they generate; the next one
  is refused. Refusing mid-stream would cut answers a client already paid for in wait;
- a day and a month are UTC's, as the daemon keeps usage (``usage.db``): a budget is the
  daemon's total for the key (``org.lokid.Lokid1.Usage.KeyTotals``, read at start and
  every :data:`TOTALS_EVERY` seconds, so that a gateway's restart does not give every key
  a fresh budget) plus what this gateway counted since it asked. The usage report
  (:mod:`lokid.gateway.usage`, once a second) and the question run side by side: counts
  reported just before the question may not be in the answer yet, and counts reported
  just after may already be; so a read may miss, or count twice, the tokens of the second
  or so around it, never more (the next read, a minute later, is exact again for all
  before). A budget may be passed, or reached early, by that much. A daemon without
  ``KeyTotals`` (older, or not reachable): budgets count from this gateway's start, said
  once in the log when a key with a budget comes (a gateway whose keys have none has
  nothing to say);
- a request sent on by a peer gateway (its hop header) is checked against the limits of
  the peer's key here, but its tokens are counted where it entered, as its usage is
  (:mod:`lokid.gateway.usage` calls no hook for it): a team's budget is spent once;
- a key without limits costs one look at its limits and no state: the anonymous
  identity of a keyless gateway and the flat ``api_keys_file``'s keys are never refused
  here. The state kept is bounded by the keys that have limits and used them in the
  last minute (empty windows are dropped every minute) and by the day and month that
  are current (older days' counts are dropped at each read of the totals);
- times are the wall clock's (``time.time()``): what a client is told is a UTC time. A
  clock stepped back holds a window's counts a little longer, never drops a limit.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from dbus_fast import DBusError

from ..core.names import BUS_NAME, OBJECT_PATH, USAGE_INTERFACE
from ..core.serve.keys import Identity
from ..host.buscall import call
from .replies import GatewayError

log = logging.getLogger("lokid.gateway")

SPAN = 60                  # seconds of a per-minute window, one bucket a second
TOTALS_EVERY = 60.0        # seconds between two reads of the daemon's totals
TOTALS_TIMEOUT = 5.0       # a read of the totals waited for at start, at most
RATE = "rate_limit_exceeded"
QUOTA = "insufficient_quota"


class Window:
    """Counts of the last :data:`SPAN` seconds, in one bucket a second (bounded whatever
    the rate); the oldest second drops out as time passes."""

    __slots__ = ("counts", "last", "total")

    def __init__(self) -> None:
        self.counts = [0] * SPAN
        self.last = 0          # the second (since the epoch) the newest bucket is for
        self.total = 0

    def _advance(self, second: int) -> None:
        if second <= self.last:
            return
        if second - self.last >= SPAN:
            self.counts = [0] * SPAN
            self.total = 0
        else:
            for s in range(self.last + 1, second + 1):
                i = s % SPAN
                self.total -= self.counts[i]
                self.counts[i] = 0
        self.last = second

    def used(self, now: float) -> int:
        self._advance(int(now))
        return self.total

    def add(self, n: int, now: float) -> None:
        second = int(now)
        self._advance(second)
        if second < self.last - SPAN + 1:
            return   # older than the window (a clock stepped back far): already out of it
        self.counts[min(second, self.last) % SPAN] += n
        self.total += n

    def frees(self, limit: int, now: float) -> float:
        """When the count falls under ``limit`` again, as buckets leave the window."""
        self._advance(int(now))
        total = self.total
        for s in range(self.last - SPAN + 1, self.last + 1):
            total -= self.counts[s % SPAN]
            if total < limit:
                return float(s + SPAN)
        return float(self.last + SPAN)


def day_of(now: float) -> str:
    return datetime.fromtimestamp(now, UTC).strftime("%Y-%m-%d")


def month_of(now: float) -> str:
    return day_of(now)[:7]


def next_day(now: float) -> float:
    d = datetime.fromtimestamp(now, UTC).replace(hour=0, minute=0, second=0,
                                                            microsecond=0)
    return (d + timedelta(days=1)).timestamp()


def next_month(now: float) -> float:
    d = datetime.fromtimestamp(now, UTC)
    year, month = (d.year + 1, 1) if d.month == 12 else (d.year, d.month + 1)
    return datetime(year, month, 1, tzinfo=UTC).timestamp()


class Calendar:
    """The UTC day and month of a time, and when each ends, worked out once a day: a
    request's check reads them, never a datetime (some 10 us each, five of them a check)."""

    __slots__ = ("start", "end", "day", "month", "month_end")

    def __init__(self) -> None:
        self.start = self.end = 0.0

    def at(self, now: float) -> Calendar:
        if not self.start <= now < self.end:
            self.day, self.month = day_of(now), month_of(now)
            self.end, self.month_end = next_day(now), next_month(now)
            self.start = self.end - 86400
        return self


def clock(at: float, now: float) -> str:
    """``at`` as a client reads it: the time of day when it is today (UTC), else the date
    and the time."""
    when = datetime.fromtimestamp(at, UTC)
    return when.strftime("%H:%M:%S UTC" if day_of(at) == day_of(now) else "%Y-%m-%d %H:%M UTC")


class LimitReached(GatewayError):
    """A 429 with the ``Retry-After`` a client waits before its next try."""

    def __init__(self, message: str, kind: str, code: str, retry_after: float):
        super().__init__(429, message, kind, code)
        self.headers = {"Retry-After": str(max(1, math.ceil(retry_after)))}


@dataclass
class Budget:
    """The tokens of one key in one period (a UTC day ``YYYY-MM-DD`` or month ``YYYY-MM``):
    the daemon's total when last read, and what this gateway counted since it asked."""
    period: str
    daemon: int = 0
    counted: int = 0      # since the last read asked (or since this gateway started)
    asked: int = 0        # ``counted`` when that read was asked

    def used(self) -> int:
        return self.daemon + self.counted


class Limiter:
    """Per key: requests and tokens of the last minute, tokens of the day and month."""

    def __init__(self, bus: Any = None):
        self.bus = bus
        self.requests: dict[str, Window] = {}
        self.tokens: dict[str, Window] = {}
        self.days: dict[str, Budget] = {}
        self.months: dict[str, Budget] = {}
        self.calendar = Calendar()
        self.failure = ""          # why the totals could not be read
        self.said = ""             # the failure said in the log (once, when a budget needs it)
        self.task: asyncio.Task[None] | None = None

    # --- on a request's path ---------------------------------------------------------

    def check(self, identity: Identity, now: float | None = None) -> None:
        """Admit a request of ``identity`` (counted in its requests per minute) or raise
        :class:`LimitReached` naming the limit it reached."""
        limits = identity.limits
        rpm, tpm = limits.requests_per_minute, limits.tokens_per_minute
        per_day, per_month = limits.tokens_per_day, limits.tokens_per_month
        if rpm is None and tpm is None and per_day is None and per_month is None:
            return
        now = time.time() if now is None else now
        name = identity.name
        if self.failure != self.said and (per_day is not None or per_month is not None):
            log.warning("the keys' token budgets count from this gateway's start: lokid did "
                        "not give its totals (%s)", self.failure)
            self.said = self.failure
        if per_month is not None or per_day is not None:
            cal = self.calendar.at(now)
            if per_month is not None:   # first: when both are used, the later reset is named
                self._budget(self.months, name, cal.month, per_month, "month", "this month",
                             cal.month_end, now)
            if per_day is not None:
                self._budget(self.days, name, cal.day, per_day, "day", "today", cal.end, now)
        if tpm is not None:
            window = self.tokens.get(name)
            used = window.used(now) if window is not None else 0
            if window is not None and used >= tpm:
                at = window.frees(tpm, now)
                raise LimitReached(f"key {name!r}: {tpm} tokens per minute ({used} used in "
                                   f"the last minute), next at {clock(at, now)}", "tokens",
                                   RATE, at - now)
        if rpm is not None:
            window = self.requests.get(name)
            if window is None:   # not setdefault: a Window (a list of SPAN) made each time
                window = self.requests[name] = Window()
            if window.used(now) >= rpm:
                at = window.frees(rpm, now)
                raise LimitReached(f"key {name!r}: {rpm} requests per minute, next at "
                                   f"{clock(at, now)}", "requests", RATE, at - now)
            window.add(1, now)

    @staticmethod
    def _budget(budgets: dict[str, Budget], name: str, period: str, limit: int, unit: str,
                which: str, resets: float, now: float) -> None:
        budget = budgets.get(name)
        used = budget.used() if budget is not None and budget.period == period else 0
        if used >= limit:
            raise LimitReached(f"key {name!r}: its budget of {limit} tokens per {unit} is "
                               f"used ({used} tokens {which}); it resets at "
                               f"{clock(resets, now)}", QUOTA, QUOTA, resets - now)

    def spent(self, identity: Identity, tokens: int, now: float | None = None) -> None:
        """A request of ``identity`` ended having used ``tokens`` (prompt and generated, the
        engine's own figures)."""
        if tokens <= 0:
            return
        now = time.time() if now is None else now
        name = identity.name
        if identity.limits.tokens_per_minute is not None:
            window = self.tokens.get(name)
            if window is None:
                window = self.tokens[name] = Window()
            window.add(tokens, now)
        cal = self.calendar.at(now)
        for budgets, period in ((self.days, cal.day), (self.months, cal.month)):
            budget = budgets.get(name)
            if budget is None or budget.period != period:
                budget = budgets[name] = Budget(period)
            budget.counted += tokens

    def on_figures(self, identity: Any, _preset: Any, figures: Any, *_rest: Any) -> None:
        """The hook :mod:`lokid.gateway.usage` calls with each request's figures."""
        if isinstance(identity, Identity) and figures is not None:
            self.spent(identity, int(getattr(figures, "prompt_tokens", 0) or 0)
                       + int(getattr(figures, "generated_tokens", 0) or 0))

    def prune(self, now: float | None = None) -> None:
        """Drop the windows with nothing left in them (a key removed, or idle a minute):
        the state kept is that of the keys with limits used in the last minute."""
        now = time.time() if now is None else now
        for windows in (self.requests, self.tokens):
            for name in [n for n, w in windows.items() if not w.used(now)]:
                del windows[name]

    # --- the daemon's totals -----------------------------------------------------------

    def totals(self, answer: dict[str, Any], asked_at: float) -> None:
        """The daemon's ``KeyTotals`` (name -> (tokens today, tokens this month)), read by
        a question asked at ``asked_at``: each key's budget is that total plus what was
        counted here since the question. Days and months past are dropped."""
        day, month = day_of(asked_at), month_of(asked_at)
        for budgets, period, index in ((self.days, day, 0), (self.months, month, 1)):
            for name in [n for n, b in budgets.items() if b.period != period]:
                del budgets[name]
            for name in answer:
                budgets.setdefault(name, Budget(period))
            for name, budget in budgets.items():
                pair = answer.get(name)
                budget.daemon = int(pair[index]) if pair is not None else 0
                budget.counted -= budget.asked   # before the question: in the daemon's
                budget.asked = 0

    async def read_totals(self) -> None:
        """One ``KeyTotals`` read; a failure keeps what is known, said once."""
        if self.bus is None:
            return
        now = time.time()
        for budgets in (self.days, self.months):
            for budget in budgets.values():
                budget.asked = budget.counted
        try:
            (answer,) = await call(self.bus, BUS_NAME, OBJECT_PATH, USAGE_INTERFACE,
                                   "KeyTotals")
        except (DBusError, OSError, EOFError) as e:
            for budgets in (self.days, self.months):
                for budget in budgets.values():
                    budget.asked = 0
            self.failure = getattr(e, "text", "") or type(e).__name__
            return
        if self.said:
            log.info("the keys' token budgets include lokid's totals again")
        self.failure = self.said = ""
        if not isinstance(answer, dict):
            return
        self.totals({str(k): v for k, v in answer.items()
                     if isinstance(v, (list, tuple)) and len(v) == 2}, now)

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(TOTALS_EVERY)
            try:
                self.prune()
                await self.read_totals()
            except Exception as e:   # a defect of ours: requests go on being served
                log.warning("reading lokid's usage totals: %s", type(e).__name__)

    async def start(self, _app: Any = None) -> None:
        """The totals read once (at most :data:`TOTALS_TIMEOUT`), then every minute."""
        try:
            await asyncio.wait_for(self.read_totals(), TOTALS_TIMEOUT)
        except TimeoutError:
            self.failure = f"no answer in {TOTALS_TIMEOUT:.0f} s"
        self.task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self, _app: Any = None) -> None:
        if self.task is not None:
            self.task.cancel()
            try:
                await self.task
            except asyncio.CancelledError:
                pass

    def install(self, app: Any) -> None:
        app.on_startup.append(self.start)
        app.on_cleanup.append(self.stop)
