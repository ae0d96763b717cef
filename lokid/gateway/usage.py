"""Who used what (issue 46, item 2, the gateway's side): each answer's figures, counted
per UTC day, key name and preset, handed to the daemon once a second, and an audit
record per request.

A request's figures are the engine's own (:class:`Figures`, read by
:mod:`lokid.gateway.figures`): from the JSON of a whole answer the gateway holds
anyway, or from the last bytes of a stream (:func:`tail_of` gives the relay and the
tunnel a :class:`~lokid.gateway.figures.Tail` to feed with what they carry). At the
answer's end, :meth:`Usage.middleware` (installed beside :mod:`lokid.gateway.report`'s):

- puts the figures on the request (:data:`~lokid.gateway.context.FIGURES_KEY`);
- adds to the counters of (day, key, preset): ``requests``, ``refused_<code>`` (an
  answer of status 400 or more; 499 for a client gone), ``prompt_tokens``,
  ``cached_tokens``, ``generated_tokens``, ``wait_ms``, ``engine_ms``, and
  ``peer_requests`` for one a peer gateway served; :mod:`lokid.gateway.report` sends
  them (``org.lokid.Lokid1.Usage.GatewayUsage``) at most once a second;
- calls each of :attr:`Usage.hooks` with ``(identity, preset, figures)`` (the key's
  token limits, :mod:`lokid.gateway.limits`);
- queues the request's audit record (:mod:`lokid.gateway.audit`), written once the
  answer went out.

Rules, each for a failure it prevents:

- counted exactly once, where the request entered: one that came from a peer gateway
  (its hop header) gets only its audit record here (``LOKID_HOP=1``), its counts are
  the sending gateway's, which reads the same figures from the answer it relays;
- no write to a database, no bus call on a request's path: a request adds to a dict
  (one entry per day, key and preset); the report's loop does the rest;
- a client gone mid-stream (499) has no final figures: what its answer's tail holds is
  counted (nothing, for llama-server's streams, whose figures come in the last event),
  its request and its refusal counted; the engine stopped with the connection;
- what is kept while the daemon does not take it is bounded (:data:`MAX_ROWS` rows);
  past it, new rows are dropped and said once (a daemon down for days, a flood of
  keys), never the gateway's memory;
- a request refused 401 (no key, a wrong one) is counted under key and preset ``-``
  (``refused_401``: someone guessing keys shows in ``lokictl usage`` and Prometheus),
  with no audit record: one entry per guess would let anyone flood the journal;
- only requests past the key check on an inference route are counted and audited; a
  refusal before the request's preset was known (a key's limit, a model it may not
  use, a model nobody serves) is counted under the preset ``-``: the preset is the
  operator's name, never a client's string (no row per guessed model name). A key or
  preset name the daemon would refuse (:mod:`lokid.core.serve.usage`) is counted as ``-``:
  one such row would have the daemon refuse the whole report it is in.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from ..core.serve.keys import ANONYMOUS_NAME
from ..core.serve.usage import key_ok, preset_ok
from .audit import Audit, Record
from .context import FIGURES_KEY, FIRST_BYTE_KEY, IDENTITY_KEY, ROUTE_KEY, WAITED_KEY, WHERE_KEY
from .figures import TAIL_KEY, UNKNOWN, Figures, figures_of, tail_of
from .peers import HOP_HEADER
from .report import CLIENT_GONE, PRESET_KEY, STATUS_KEY

log = logging.getLogger("lokid.gateway")

__all__ = ["MAX_ROWS", "Figures", "Usage", "tail_of"]

MAX_ROWS = 20000      # (day, key, preset) rows kept while the daemon does not take them
BATCH = 4096          # rows of one GatewayUsage call (lokid.core.serve.usage.MAX_ROWS)
MAX_COUNTERS = 64     # counters of one row (lokid.core.serve.usage.MAX_COUNTERS)
NO_PRESET = "-"       # a refusal before the request's preset was known (or its key)
COUNTERS = ("requests", "prompt_tokens", "cached_tokens", "generated_tokens", "wait_ms",
            "engine_ms", "peer_requests")
START_KEY: Any = web.RequestKey("lokid_start", float) if hasattr(web, "RequestKey") \
    else "lokid_start"
# The preset a peer gateway served (its name, as this gateway's client asked it): counted
# here under it. Not report.PRESET_KEY, which counts this host's own presets' answers.
PEER_PRESET_KEY: Any = web.RequestKey("lokid_peer_preset", str) \
    if hasattr(web, "RequestKey") else "lokid_peer_preset"

# A name's check (two regular expressions) remembered: the same few keys and presets come
# again and again; a bounded cache, so that guessed names cannot grow it
_key_ok = functools.lru_cache(maxsize=4096)(key_ok)
_preset_ok = functools.lru_cache(maxsize=4096)(preset_ok)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
Row = tuple[str, str, str]   # UTC day, key name, preset


_day: list[Any] = [-1, ""]   # the last second asked, its day


def utc_day(now: float) -> str:
    """The UTC day of ``now`` as YYYY-MM-DD (the same second's answer kept)."""
    second = int(now)
    if _day[0] != second:
        _day[:] = [second, time.strftime("%Y-%m-%d", time.gmtime(second))]
    return _day[1]   # type: ignore[no-any-return]


class Usage:
    BATCH = BATCH

    def __init__(self, audit: Audit | None = None):
        self.audit = audit or Audit()
        self.pending: dict[Row, dict[str, int]] = {}
        self.dropped = 0     # requests whose row found no room
        self.said_full = False
        self.hooks: list[Callable[[Any, str, Figures | None], None]] = []

    async def on_prepare(self, request: web.Request, _response: web.StreamResponse) -> None:
        """The answer's head goes out (aiohttp's on_response_prepare): its first byte."""
        if FIRST_BYTE_KEY not in request:
            request[FIRST_BYTE_KEY] = asyncio.get_running_loop().time()

    @web.middleware
    async def middleware(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        request[START_KEY] = asyncio.get_running_loop().time()
        try:
            response = await handler(request)
        except asyncio.CancelledError:
            self.ended(request, None, CLIENT_GONE)
            raise
        except web.HTTPException as e:
            self.ended(request, None, e.status)
            raise
        except Exception:
            self.ended(request, None, 500)
            raise
        self.ended(request, response, request.get(STATUS_KEY, response.status))
        return response

    def ended(self, request: web.Request, response: web.StreamResponse | None,
              status: int) -> None:
        """The request's answer ended with ``status``: counted, hooked, audited."""
        route = request.get(ROUTE_KEY)
        if route is None:   # refused before its key was checked, or not an inference route
            if status == 401:   # a missing or wrong key: counted, no record (no flood)
                self.count((utc_day(time.time()), NO_PRESET, NO_PRESET), status, UNKNOWN,
                           0.0, "local")
            return
        figures = self._figures(request, response)
        request[FIGURES_KEY] = figures
        identity = request.get(IDENTITY_KEY)
        name = getattr(identity, "name", ANONYMOUS_NAME)
        preset = request.get(PRESET_KEY) or request.get(PEER_PRESET_KEY) or ""   # none: a
        # refusal before its model was known
        where = request.get(WHERE_KEY, "local")
        hop = HOP_HEADER in request.headers
        waited = float(request.get(WAITED_KEY, 0.0)) * 1000
        now = asyncio.get_running_loop().time()
        start = request.get(START_KEY, now)
        first = request.get(FIRST_BYTE_KEY)
        if first is None and response is not None and not response.prepared:
            first = now   # a whole answer: its head goes out as the middleware returns it
        if not hop:
            self.count((utc_day(time.time()), name if _key_ok(name) else NO_PRESET,
                        preset if preset and _preset_ok(preset) else NO_PRESET), status,
                       figures, waited, where)
            if preset:
                for hook in self.hooks:
                    try:
                        hook(identity, preset, figures if figures.known else None)
                    except Exception as e:   # a defect of a hook's: the answer went out
                        log.warning("usage: a hook failed: %s: %s", type(e).__name__, e)
        if not self.audit.quiet:
            self.audit.post(Record(name, preset, route, status, figures, waited,
                                   None if first is None else (first - start) * 1000,
                                   (now - start) * 1000, where, hop))

    @staticmethod
    def _figures(request: web.Request, response: web.StreamResponse | None) -> Figures:
        tail = request.get(TAIL_KEY)
        if tail is not None and tail.size:   # a stream (the tunnel's whole answers: none)
            return tail.figures()   # type: ignore[no-any-return]
        if isinstance(response, web.Response) and isinstance(response.body, bytes) \
                and "Content-Encoding" not in response.headers:
            return figures_of(response.body)
        return UNKNOWN

    def count(self, row: Row, status: int, figures: Figures, wait_ms: float,
              where: str) -> None:
        counters = self.pending.get(row)
        if counters is None:
            if len(self.pending) >= MAX_ROWS:
                self.dropped += 1
                if not self.said_full:
                    log.warning("usage: %d rows wait for lokid to take them: the counts of "
                                "new keys, presets or days are dropped until it does",
                                MAX_ROWS)
                    self.said_full = True
                return
            counters = self.pending[row] = dict.fromkeys(COUNTERS, 0)
        counters["requests"] += 1
        if 400 <= status <= 599:
            code = f"refused_{status}"
            if code in counters or len(counters) < MAX_COUNTERS:
                counters[code] = counters.get(code, 0) + 1
        counters["prompt_tokens"] += figures.prompt_tokens
        counters["cached_tokens"] += figures.cached_tokens
        counters["generated_tokens"] += figures.generated_tokens
        counters["wait_ms"] += round(wait_ms)
        counters["engine_ms"] += round(figures.engine_ms)
        if where.startswith("peer:"):
            counters["peer_requests"] += 1

    def batch(self) -> dict[Row, dict[str, int]]:
        """At most :data:`BATCH` pending rows (copies), for one report."""
        out: dict[Row, dict[str, int]] = {}
        for row, counters in self.pending.items():
            if len(out) >= BATCH:
                break
            out[row] = dict(counters)
        return out

    @staticmethod
    def rows(batch: dict[Row, dict[str, int]]) -> list[list[Any]]:
        """``batch`` as GatewayUsage takes it (``a(sssa{st})``): zeros left out."""
        return [[day, key, preset, {k: v for k, v in counters.items() if v}]
                for (day, key, preset), counters in sorted(batch.items())]

    def taken(self, sent: dict[Row, dict[str, int]]) -> None:
        """``sent`` (a copy of :attr:`pending` made before the call) was taken: what came
        meanwhile stays pending."""
        for row, counters in sent.items():
            now = self.pending.get(row)
            if now is None:
                continue
            left = {k: now.get(k, 0) - v for k, v in counters.items()}
            left.update({k: v for k, v in now.items() if k not in counters})
            if any(left.values()):
                self.pending[row] = {**dict.fromkeys(COUNTERS, 0), **left}
            else:
                del self.pending[row]
        if len(self.pending) < MAX_ROWS:
            self.said_full = False

