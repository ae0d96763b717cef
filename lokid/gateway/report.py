"""The gateway's figures for the daemon: its requests by preset and status code, and its
GPU groups' swaps, sent at most once a second (issue 22, item 6).

Never a bus call per request: a request only adds one to a counter here (an aiohttp
middleware, :meth:`Report.middleware`, which sees the status every answer went out
with; a client gone before its answer counts as 499, as nginx writes it). Once a second,
when something moved, one ``GatewayReport`` call hands the daemon the counts since the
last one; the daemon adds them to the preset's Stats and to Prometheus
(:mod:`lokid.dbus.sight`). The swaps are the groups' own count (``Group.swaps``,
:mod:`lokid.gateway.groups`), read here.

Faults: a report the daemon does not take (it restarts, it is older and knows no
``GatewayReport``) keeps the counts for the next one, and is logged once until one goes
through; the counts kept are bounded by the presets and codes they name (at most
:data:`MAX_KEPT` pairs). A request never waits for a report.

Usage (issue 46, item 2): the same loop hands the daemon the rows of
:class:`lokid.gateway.usage.Usage` (counters per UTC day, key name and preset) with one
``org.lokid.Lokid1.Usage.GatewayUsage`` call when any moved, under the same rules: not
taken (a daemon older than usage, restarting), they stay for the next report and the
failure is said once; what came meanwhile is never lost by a report taken.

Cold starts are the daemon's to count: :func:`start_for_request` asks the start with
``StartForRequest``, which marks it as asked for a request (``StartPreset`` where the
daemon is older).
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web
from dbus_fast import DBusError
from dbus_fast.aio import MessageBus

from ..core.errors import INVALID_ARGS
from ..core.names import BUS_NAME, MANAGER_INTERFACE, OBJECT_PATH
from ..host.buscall import call

log = logging.getLogger("lokid.gateway")

REPORT_EVERY = 1.0        # seconds between two reports, at least
MAX_KEPT = 4096           # (preset, code) pairs kept while the daemon does not take them
# The request's preset, for its count (set by the routes): a typed key where aiohttp has
# them (3.12; a plain string warns there), the string on Debian's 3.8 and 3.10.
PRESET_KEY: Any = web.RequestKey("lokid_preset", str) if hasattr(web, "RequestKey") \
    else "lokid_preset"
# The status a request is counted with when it is not its answer's (a client gone
# mid-stream: its answer went out 200, it is counted CLIENT_GONE).
STATUS_KEY: Any = web.RequestKey("lokid_status", int) if hasattr(web, "RequestKey") \
    else "lokid_status"
CLIENT_GONE = 499
# A daemon older than StartForRequest, or a bus policy that does not list it yet (the
# policy file is reread by the bus, not by lokid): the plain StartPreset then.
OLD_DAEMON = ("org.freedesktop.DBus.Error.UnknownMethod", "org.freedesktop.DBus.Error.AccessDenied")
USAGE_INTERFACE = BUS_NAME + ".Usage"

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class Report:
    def __init__(self, bus: MessageBus, groups: Any, usage: Any = None):
        self.bus = bus
        self.groups = groups          # lokid.gateway.groups.Groups: its groups' swaps
        self.usage = usage            # lokid.gateway.usage.Usage: who used what
        self.usage_failure = ""
        self.pending: Counter[tuple[str, int]] = Counter()
        self.swaps_sent: dict[str, int] = {}
        self.failure = ""
        self.task: asyncio.Task[None] | None = None

    @web.middleware
    async def middleware(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        try:
            response = await handler(request)
        except asyncio.CancelledError:
            self.count(request, CLIENT_GONE)
            raise
        except web.HTTPException as e:
            self.count(request, e.status)
            raise
        except Exception:
            self.count(request, 500)
            raise
        self.count(request, request.get(STATUS_KEY, response.status))
        return response

    def count(self, request: web.Request, status: int) -> None:
        preset = request.get(PRESET_KEY)
        if not preset:
            return   # not a model's request (/health, /v1/models), or no such model
        key = (str(preset), int(status))
        if key in self.pending or len(self.pending) < MAX_KEPT:
            self.pending[key] += 1

    def start(self) -> None:
        self.task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> None:
        """The last counts sent (briefly), then no more reports."""
        if self.task is not None:
            self.task.cancel()
            try:
                await self.task
            except asyncio.CancelledError:
                pass
        try:
            await asyncio.wait_for(self.send(), 2.0)
        except (TimeoutError, OSError, EOFError):
            pass

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(REPORT_EVERY)
            try:
                await self.send()
            except Exception as e:   # a defect of ours: the requests go on being served
                log.warning("report to lokid: %s: %s", type(e).__name__, e)

    def _swaps(self) -> dict[str, int]:
        totals = {name: int(g.swaps) for name, g in self.groups.groups.items()}
        return {name: n - self.swaps_sent.get(name, 0) for name, n in totals.items()
                if n > self.swaps_sent.get(name, 0)}

    async def send(self) -> None:
        """One GatewayReport of what moved since the last one taken, one GatewayUsage of
        the usage rows; nothing if nothing."""
        await self.send_usage()
        swaps = self._swaps()
        if not self.pending and not swaps:
            return
        sent = Counter(self.pending)
        try:
            await call(self.bus, BUS_NAME, OBJECT_PATH, MANAGER_INTERFACE, "GatewayReport",
                       "a(squ)a(su)", [[[p, c, n] for (p, c), n in sorted(sent.items())],
                                       [[g, n] for g, n in sorted(swaps.items())]])
        except DBusError as e:
            if e.text != self.failure:
                log.warning("lokid did not take the gateway's figures (kept for the next "
                            "report): %s", e.text)
                self.failure = e.text
            return
        if self.failure:
            log.info("lokid takes the gateway's figures again")
            self.failure = ""
        self.pending.subtract(sent)   # what came meanwhile stays for the next report
        self.pending = +self.pending
        for name, n in swaps.items():
            self.swaps_sent[name] = self.swaps_sent.get(name, 0) + n


    async def send_usage(self) -> None:
        """The usage rows, in calls of at most BATCH rows; rows the daemon refuses as
        wrong (InvalidArgs: a fault of ours) are dropped and said, not sent forever."""
        if self.usage is None:
            return
        for _ in range(-(-len(self.usage.pending) // self.usage.BATCH)):   # what is here now
            if not self.usage.pending or not await self._usage_call(self.usage.batch()):
                return

    async def _usage_call(self, sent: dict[Any, dict[str, int]]) -> bool:
        try:
            await call(self.bus, BUS_NAME, OBJECT_PATH, USAGE_INTERFACE, "GatewayUsage",
                       "a(sssa{st})", [self.usage.rows(sent)])
        except DBusError as e:
            if e.type == INVALID_ARGS:
                log.warning("lokid refused the gateway's usage (%d rows dropped): %s",
                            len(sent), e.text)
                self.usage.taken(sent)
                return True
            if e.text != self.usage_failure:
                log.warning("lokid did not take the gateway's usage (kept for the next "
                            "report: %d rows): %s", len(sent), e.text)
                self.usage_failure = e.text
            return False
        if self.usage_failure:
            log.info("lokid takes the gateway's usage again")
            self.usage_failure = ""
        self.usage.taken(sent)
        return True


async def start_for_request(presets: Any, name: str) -> str:
    """The on-demand start of ``name`` (StartForRequest: the daemon counts a cold start and
    shows "starting for a request"); StartPreset where the daemon or the bus policy does not
    know that method yet."""
    try:
        (job,) = await call(presets.bus, BUS_NAME, OBJECT_PATH, MANAGER_INTERFACE,
                            "StartForRequest", "s", [name])
    except DBusError as e:
        if e.type not in OLD_DAEMON:
            raise
        return str(await presets.start(name))
    return str(job)
