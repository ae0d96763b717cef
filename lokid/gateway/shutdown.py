"""The gateway's stop (SIGTERM, SIGINT): stop accepting, let the requests in flight end
within a bound, then exit 0 (issue 28, item 16).

aiohttp's own cleanup waited for each connection's request up to its shutdown timeout
(60 s), cancelled it, then waited up to 60 s again; on Python 3.12 and later a site's stop
also waits for every connection to close. A stream in flight held the stop past
loki-gateway.service's TimeoutStopSec (90 s then): systemd killed the gateway, the stream
was cut without a word, and every new client waited those 90 s in the socket's backlog.

Rules, each for a failure it prevents:

- accepting stops at once, and every idle keep-alive connection is closed: a client's
  next request goes to the next instance, not to one that is leaving. The listening
  sockets closed are this process's copies: under systemd the socket unit keeps its own,
  so a new connection waits in its backlog and the next instance (started once this one
  has exited) takes it; no client is refused by a restart;
- a connection busy with a request is closed after its answer (aiohttp's graceful
  ``close()``), never in the middle of it; one that was still receiving a request's
  head is closed with the idle ones (the client sees the connection close unanswered,
  as at an idle keep-alive close, and may send it again);
- each request in flight may run on for its preset's ``serve.drain`` (what a swap waits
  for it), never more than :data:`MAX_DRAIN`: new clients wait in the backlog that long,
  so the bound is what a restart costs them. A request whose preset is not known yet
  (its body still coming) gets :data:`MAX_DRAIN`;
- at its bound a request is ended in words: a stream of events gets a last event holding
  the error, an answer not begun gets 503 in OpenAI's shape, anything else already begun
  is cut off (its connection closed before the end), which a client reads as an error.
  Its engine's request is closed with it (the relay's ``async with``): the slot is freed;
- a second SIGTERM or SIGINT ends every request at once (an operator's second Ctrl-C);
- aiohttp's cleanup runs after, with nothing left to wait for.

What it needs of the gateway: a middleware (:meth:`Draining.middleware`, the innermost)
and a response hook (``on_response_prepare``), added by
:func:`lokid.gateway.server.start_sites`, and sites whose accepting can stop alone
(:class:`StoppableSite`).
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from .headtimeout import DeadlineSite
from .replies import UNAVAILABLE, error_body
from .report import PRESET_KEY

log = logging.getLogger("lokid.gateway")

# At most this long for a request after SIGTERM (seconds): loki-gateway.service's
# TimeoutStopSec= (45 s) leaves room for the rest of the exit beyond it.
MAX_DRAIN = 30.0
# After a request was ended, this long for its handler to finish before the cleanup goes
# on without it (it should take a moment: a write, a close).
GRACE = 5.0
CODE = "gateway_stopping"
# The request's place in flight (set by the middleware): a typed key where aiohttp has them.
FLIGHT_KEY: Any = web.RequestKey("lokid_flight", object) if hasattr(web, "RequestKey") \
    else "lokid_flight"

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@dataclass(eq=False)
class Flight:
    """One request the application is serving."""

    request: web.Request
    task: asyncio.Task[Any] | None
    response: web.StreamResponse | None = None   # once its answer began
    ended: bool = False                          # cut at its bound by the stop


def ended_message(bound: float) -> str:
    return (f"the gateway stopped (a restart or a stop of its service) before this answer "
            f"ended: it waits {bound:g} s for requests in flight; send the request again")


def sse_stopped(bound: float) -> bytes:
    """The last event of a stream ended by the stop."""
    body = error_body(ended_message(bound), UNAVAILABLE, CODE)
    return b"data: " + json.dumps(body).encode() + b"\n\n"


class StoppableSite(DeadlineSite):
    """The gateway's site, whose accepting stops without waiting for its connections
    (aiohttp's ``stop()`` may wait for every one of them to close)."""

    def stop_accepting(self) -> None:
        server = self._server   # BaseSite's asyncio server, set by DeadlineSite.start()
        if server is not None:
            server.close()      # this process's copy only: systemd keeps its own


class Draining:
    """The requests in flight, and the stop that lets them end.

    ``drain_of``: a preset's ``serve.drain`` in seconds (None for an unknown preset)."""

    def __init__(self, drain_of: Callable[[str], float | None],
                 max_drain: float = MAX_DRAIN) -> None:
        self.drain_of = drain_of
        self.max_drain = max_drain
        self.flights: set[Flight] = set()
        self.changed = asyncio.Event()
        self.hurried = False

    def attach(self, app: web.Application) -> None:
        """Before the application is frozen (``runner.setup()``)."""
        app.middlewares.append(self.middleware)
        app.on_response_prepare.append(self._prepared)

    @web.middleware
    async def middleware(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        flight = Flight(request, asyncio.current_task())
        request[FLIGHT_KEY] = flight
        self.flights.add(flight)
        try:
            return await handler(request)
        except asyncio.CancelledError:
            if not flight.ended:
                raise   # the client went away (aiohttp cancels its handler)
            if flight.task is not None:
                flight.task.uncancel()   # ours: the answer is still to be ended
            return await self._end(flight)
        finally:
            self.flights.discard(flight)
            self.changed.set()

    async def _prepared(self, request: web.Request, response: web.StreamResponse) -> None:
        flight = request.get(FLIGHT_KEY)
        if isinstance(flight, Flight):
            flight.response = response

    def bound(self, flight: Flight) -> float:
        """How long ``flight`` may run on after the stop began."""
        preset = flight.request.get(PRESET_KEY)
        drain = self.drain_of(str(preset)) if preset else None
        return self.max_drain if drain is None else max(0.0, min(drain, self.max_drain))

    async def _end(self, flight: Flight) -> web.StreamResponse:
        """The answer of a request cut at its bound."""
        bound = self.bound(flight)
        response = flight.response
        if response is None or not response.prepared:
            return web.json_response(error_body(ended_message(bound), UNAVAILABLE, CODE),
                                     status=503, headers={"Connection": "close"})
        transport = flight.request.transport
        if response.content_type == "text/event-stream":
            try:
                await response.write(sse_stopped(bound))
                await response.write_eof()
                return response
            except (ConnectionError, RuntimeError):
                pass   # the client is gone, or the answer had ended: nothing more to say
        if transport is not None:
            transport.close()   # cut off: the client sees an incomplete answer
        return response

    def hurry(self) -> None:
        """A second signal: every request in flight is ended now."""
        self.hurried = True
        self.changed.set()

    async def stop(self, runner: web.AppRunner) -> tuple[int, int]:
        """Stop accepting, close idle connections, let the requests in flight end within
        their bounds; the requests that ended by themselves and those ended at their
        bound."""
        loop = asyncio.get_running_loop()
        began = loop.time()
        for site in runner.sites:
            if isinstance(site, StoppableSite):
                site.stop_accepting()
        # a request whose head was read is in flight from its handler's first step: on
        # Python 3.11 that task starts at the loop's next turn
        await asyncio.sleep(0)
        if runner.server is not None:
            busy = {f.request.transport for f in self.flights}
            for connection in runner.server.connections:
                if connection.transport in busy:
                    connection.close()         # after its answer
                else:
                    connection.force_close()   # idle (aiohttp 3.9's close() leaves it open)
        if self.flights:
            log.info("stopping: %d request(s) in flight, each given its preset's drain "
                     "(at most %gs)", len(self.flights), self.max_drain)
        cut = 0
        seen = set(self.flights)
        give_up = began + self.max_drain + GRACE
        while self.flights:
            now = loop.time()
            if now >= give_up:
                log.warning("stopping: %d request(s) did not end; the cleanup goes on",
                            len(self.flights))
                break
            waits = []
            for flight in self.flights:
                seen.add(flight)
                if flight.ended:
                    continue
                due = began + self.bound(flight)
                if self.hurried or now >= due:
                    flight.ended = True
                    cut += 1
                    if self.hurried:
                        give_up = min(give_up, now + GRACE)
                    if flight.task is not None:
                        flight.task.cancel()
                else:
                    waits.append(due)
            self.changed.clear()
            timeout = max(0.0, min([*waits, give_up]) - now)
            try:
                await asyncio.wait_for(self.changed.wait(), timeout)
            except TimeoutError:
                pass
        finished = len(seen) - cut
        if seen:
            log.info("stopped: %d request(s) ended by themselves, %d at their drain "
                     "(%.1fs)", finished, cut, loop.time() - began)
        return finished, cut
