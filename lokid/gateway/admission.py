"""The gate in front of each engine: at most its slots in flight, the rest waiting by fair
share between keys, a full queue refused 429 (issue 46, items 3 and 4).

Who goes next is :mod:`lokid.core.serve.fairshare` (pure, table-tested); this is its asyncio
edge, entered by a request once its group's turn is its own and its engine is started
(:meth:`lokid.gateway.server.Gateway._route`). Rules, each for the failure it prevents:

- **at most the engine's slots in flight from the gateway**: llama-server queues what its
  slots cannot start in one FIFO across every client, so a key that sent 32 requests
  stood in front of everyone. The slots are the engine's ``-np``/``--parallel`` (its
  running command line, else the next start's), else its ``/props`` ``total_slots``, read
  once per start of the engine in the background, else llama-server's own default
  (``-np -1``, auto: 4 slots in b11434, :data:`lokid.core.place.need.DEFAULT_PARALLEL`,
  checked against the real engine in tests/gateway/test_admission.py). An API elsewhere
  (an external preset) has no slots here: only a key's ``max_in_flight`` holds it;
- **no added wait while a slot is free**: a request that can go goes in the same step
  (no task, no timer): a single client sees today's gateway;
- **a client gone while waiting leaves the queue at once**, and one gone after its turn
  came gives its slot back (the ticket is left in a ``finally``): a slot is never leaked,
  or the gate would end up admitting nothing. aiohttp 3.9+ cancels the handler of a
  client gone (``handler_cancellation``, :func:`lokid.gateway.server.runner_kwargs`);
  Debian 12's 3.8.4 does not (its ``connection_lost`` only fails the body's reads), so
  there a waiter looks at its connection every :data:`GONE_POLL` seconds: a client gone
  held its place until its turn came, and counted against the queue's bounds;
- **a full queue is answered, not held**: 429 in OpenAI's shape (``type`` ``requests``,
  ``code`` ``rate_limit_exceeded``, as OpenAI's own rate limits answer) with
  ``Retry-After`` in seconds from the queue's measured pace, and a message naming the
  queue (the preset's, or the key's on that preset), how many wait and the bound;
- the time a request waited here is noted (``request[WAITED_KEY]``) for usage and the
  audit record; its key is ``request[IDENTITY_KEY]`` (:mod:`lokid.gateway.keys`), the
  anonymous identity where the gateway has no keys. Without keys every client is the
  same key, so only the preset's bound applies (a per-key bound would cut the one
  anonymous crowd at a key's bound).
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Callable, Sequence

import aiohttp
from aiohttp import web

from ..core.config.external import EXTERNAL
from ..core.launch.flags import flag_value
from ..core.place.need import DEFAULT_PARALLEL, PARALLEL
from ..core.serve.fairshare import UNLIMITED, FairShare, QueueFull, Ticket
from ..core.serve.keys import ANONYMOUS, Identity
from .context import IDENTITY_KEY, TICKET_KEY, WAITED_KEY
from .presets import Preset
from .replies import GatewayError

log = logging.getLogger("lokid.gateway")

PROPS_TIMEOUT = 5.0           # seconds for an engine's /props (its slots), in the background
MAX_PROPS_READ = 4 * 1024 * 1024
RATE_LIMIT_TYPE = "requests"  # OpenAI's error type for a rate limit on requests
# aiohttp before 3.9 never cancels the handler of a client gone: a waiter looks itself
CANCELS_GONE = tuple(int(x) for x in aiohttp.__version__.split(".")[:2]) >= (3, 9)
GONE_POLL = 0.25              # seconds between those looks (aiohttp 3.8 only)
# Routes that never take one of the engine's slots: answered by its HTTP threads at once
UNGATED = frozenset({"/tokenize", "/detokenize", "/apply-template", "/props", "/health",
                     "/v1/health", "/slots", "/metrics", "/v1/models", "/models",
                     # a running completion's control (issue 48): behind that completion's
                     # slot it would wait for the end it asks for
                     "/v1/chat/completions/control"})


class QueueFullError(GatewayError):
    """429 for a full queue, with ``Retry-After``."""

    def __init__(self, full: QueueFull):
        super().__init__(429, str(full), RATE_LIMIT_TYPE, "rate_limit_exceeded")
        self.headers = {"Retry-After": str(full.retry_after)}


def argv_slots(argv: Sequence[str]) -> int:
    """The slots an engine started with ``argv`` has by its command line; 0 when it does
    not say (``-np -1`` or no ``-np``: llama-server's own choice)."""
    value = flag_value(list(argv[1:]), *PARALLEL)
    try:
        n = int(value) if value is not None else 0
    except ValueError:
        return 0
    return n if n > 0 else 0


class Admission:
    """The gates of every preset of this gateway."""

    def __init__(self, max_queue: int, max_queue_per_key: int,
                 client: Callable[[], aiohttp.ClientSession | None],
                 key_of: Callable[[str], str | None]):
        self.share = FairShare(max_queue, max_queue_per_key)
        self.client = client
        self.key_of = key_of
        self.waiters: dict[Ticket, asyncio.Future[None]] = {}
        # the slots each engine's /props said, with the start (Preset.ready_at) they are of
        self.read: dict[str, tuple[float, int]] = {}
        self.reading: dict[str, asyncio.Task[None]] = {}
        self.by_argv: dict[str, tuple[tuple[str, ...], int]] = {}

    def slots(self, preset: Preset, url: str) -> int:
        """How many requests ``preset``'s ready engines serve at once: one engine's slots
        times its ready engines (its replicas, issue 47: lokid.gateway.replicas)."""
        one = self.engine_slots(preset, url)
        engines = sum(1 for e in preset.engines if e.state == "ready" and not e.draining)
        return one * engines if engines > 1 and one < UNLIMITED else one

    def resize(self, preset: Preset) -> None:
        """The preset's gate told its slots now (a replica became ready or went): those
        waiting that its new slots admit go on at once, not at the next arrival."""
        q = self.share.presets.get(preset.name)
        if q is not None and preset.url:
            n = self.slots(preset, preset.url)
            if n != q.slots:
                self._wake(self.share.set_slots(preset.name, n, time.monotonic()))

    def engine_slots(self, preset: Preset, url: str) -> int:
        """How many requests one engine of ``preset`` serves at once (see the rules)."""
        if preset.kind == EXTERNAL:
            return UNLIMITED
        argv = preset.engine_argv
        known = self.by_argv.get(preset.name)
        if known is None or known[0] is not argv:   # parsed once per command line
            known = self.by_argv[preset.name] = (argv, argv_slots(argv))
        n = known[1]
        if n:
            return n
        got = self.read.get(preset.name)
        if got is not None and got[0] == preset.ready_at:
            return got[1]
        if url and preset.name not in self.reading:
            task = asyncio.get_running_loop().create_task(self._read_slots(preset, url))
            self.reading[preset.name] = task
            task.add_done_callback(lambda _t: self.reading.pop(preset.name, None))
        return got[1] if got is not None else DEFAULT_PARALLEL

    def gate(self, request: web.Request, preset: Preset, url: str, route: str) -> Gate:
        """Until ``request``'s turn at ``preset``'s engine (``async with``); it holds its
        slot until the block ends. QueueFullError when its queue is full."""
        return Gate(self, request, preset, url, route)

    def waiting(self) -> dict[str, int]:
        """Requests waiting for a slot, by preset."""
        return {name: q.queued for name, q in self.share.presets.items() if q.queued}

    def _wake(self, admitted: list[Ticket]) -> None:
        for t in admitted:
            waiter = self.waiters.get(t)
            if waiter is not None and not waiter.done():
                waiter.set_result(None)

    async def _read_slots(self, preset: Preset, url: str) -> None:
        """``total_slots`` of the engine's /props, for its current start; nothing on a
        fault (the default stays: a request is never failed for this)."""
        started = preset.ready_at
        client = self.client()
        if client is None:
            return
        key = self.key_of(preset.name)
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        try:
            async with asyncio.timeout(PROPS_TIMEOUT):
                async with client.get(url + "/props", headers=headers) as r:
                    if r.status != 200:
                        return
                    data = await r.content.read(MAX_PROPS_READ)
            props = json.loads(data)
        except (aiohttp.ClientError, OSError, ValueError, TimeoutError) as e:
            log.debug("preset %s: its engine's slots not read: %s", preset.name,
                      type(e).__name__)
            return
        total = props.get("total_slots") if isinstance(props, dict) else None
        if isinstance(total, int) and not isinstance(total, bool) and total > 0 and \
                preset.ready_at == started:
            self.read[preset.name] = (started, total)
            self._wake(self.share.set_slots(preset.name, self.slots(preset, url),
                                            time.monotonic()))


class Gate:
    """One request's passage through :meth:`Admission.gate`: a class, not an
    ``asynccontextmanager``, whose generator, frames and ``anext`` cost a request ~1 us
    more (benchmarks/admission_gate.py); the ticket is given back at the block's end, or
    at once where the wait itself ends in an error or a cancellation."""

    __slots__ = ("admission", "request", "preset", "url", "route", "ticket")

    def __init__(self, admission: Admission, request: web.Request, preset: Preset, url: str,
                 route: str):
        self.admission, self.request, self.preset = admission, request, preset
        self.url, self.route = url, route
        self.ticket: Ticket | None = None

    async def __aenter__(self) -> None:
        if self.route in UNGATED:
            return
        a, request = self.admission, self.request
        ident: Identity = request.get(IDENTITY_KEY, ANONYMOUS)
        try:
            ticket = a.share.arrive(self.preset.name, ident.name, batch=ident.batch,
                                    limit=ident.limits.max_in_flight,
                                    slots=a.slots(self.preset, self.url), now=time.monotonic(),
                                    per_key_bound=ident is not ANONYMOUS)
        except QueueFull as e:
            raise QueueFullError(e) from None
        if a.waiters:
            # an arrival may let others in too (FairShare.arrive fills the engine's free
            # slots, a waiting batch request among them once the interactive reserve has
            # shrunk): each is woken, or it held its slot and its client forever
            a._wake([t for t in a.waiters if t.admitted])
        if not ticket.admitted:
            request[TICKET_KEY] = ticket   # its place, for a waiting client's comments
            waiter = asyncio.get_running_loop().create_future()
            a.waiters[ticket] = waiter
            try:
                await (waiter if CANCELS_GONE else _turn_or_gone(waiter, request))
            except BaseException:   # its client gone while it waited: its place given back
                a._wake(a.share.leave(ticket, time.monotonic()))
                raise
            finally:
                a.waiters.pop(ticket, None)
        request[WAITED_KEY] = ticket.waited()
        self.ticket = ticket

    async def __aexit__(self, *_exc: object) -> None:
        if self.ticket is not None:   # ended, or its client gone: its place given back
            ticket, self.ticket = self.ticket, None
            self.admission._wake(self.admission.share.leave(ticket, time.monotonic()))


async def _turn_or_gone(waiter: asyncio.Future[None], request: web.Request) -> None:
    """``waiter``, or cancelled as aiohttp 3.9+ cancels a handler once its client's
    connection is gone (aiohttp 3.8's ``request.transport`` is then None)."""
    while True:
        done, _ = await asyncio.wait((waiter,), timeout=GONE_POLL)
        if done:
            return waiter.result()
        if request.transport is None or request.transport.is_closing():
            raise asyncio.CancelledError()
