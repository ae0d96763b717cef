"""``org.lokid.Lokid1.Usage`` at ``/org/lokid/Lokid1``: who used what, kept by the daemon
(issue 46, item 2).

The gateway counts each request where it entered, from the engine's own figures, and
reports its counts per (UTC day, key name, preset) at most once a second with
``GatewayUsage`` (:mod:`lokid.gateway.usage`); the daemon keeps them in ``usage.db``
(:mod:`lokid.store.usage`) for ``[usage] retention_days`` (lokid.toml), answers
``Usage`` (``lokictl usage``, the Cockpit page) and ``KeyTotals`` (the gateway's day and
month budgets, :mod:`lokid.gateway.limits`), and writes the Prometheus counters by key
and preset (:mod:`lokid.watch.usageprom`). Who may call what, and why:

- ``GatewayUsage`` and ``KeyTotals``: the manage action, and then only root, this
  daemon's user or the gateway's user (``loki-gateway``), as ``GatewayReport``
  (:meth:`lokid.dbus.sight.Sight.check_reporter`) is: an operator in group ``loki`` could
  otherwise forge a colleague's usage, or read the budgets to time a flood;
- ``ReportQueues`` (who waits in the gateway, where and why: :mod:`lokid.gateway.waiting`)
  as ``GatewayUsage``; its ``Queues`` property is anyone's, as the manager's ``Waits``;
- ``Usage``: anyone (READ), as a preset's ``Stats``: it says key names and counts,
  never a key, a prompt or an answer, and the same counts are in the Prometheus
  textfile, which node_exporter serves to whoever scrapes it. An operator who wants the
  names private keeps both from the host's users (a bus policy deny for Usage).

Rows are checked before anything is taken (:func:`lokid.core.serve.usage.check_rows`): a call
with one bad row is refused whole, with the row's place and what would be valid, and
nothing of it is counted. Days older than the retention are dropped (they would be
deleted at the next purge anyway): a gateway that held its counts through a long outage
of the daemon does not resurrect them.

This module uses no postponed annotations: dbus-fast reads the string signatures.
"""

# dbus-fast's string signatures, read as annotations: neither a Python type nor a name
# ruff: noqa: F722, F821
# mypy: disable-error-code="valid-type"

import asyncio
import logging
import time
from collections import Counter
from datetime import UTC, date, datetime
from typing import Any, Protocol

from dbus_fast import PropertyAccess, Variant
from dbus_fast.service import ServiceInterface, dbus_property, method

from ..core.errors import LokiError, PermissionDeniedError
from ..core.names import GATEWAY_USER, USAGE_INTERFACE
from ..core.serve import usage as rules
from ..core.serve import waiting
from ..host.buscall import plain
from ..store.usage import UsageStore
from ..watch.promfile import Textfile
from ..watch.usageprom import pair_of, render, usage_path
from .access import MANAGE, READ, access, guarded
from .team import FACTORIES

log = logging.getLogger("lokid.usage")

TICK = 1.0              # seconds between two looks at what is due
RETRY_EVERY = 5.0       # seconds between two writes of counts a fault held in memory
SETTINGS_EVERY = 3600.0  # seconds between two reads of [usage] retention_days
UNREAD_EVERY = 60.0      # the same while lokid.toml could not be read yet
PROM_REFRESH = 15.0     # the usage textfile is rewritten at least this often once written


def utc_today() -> date:
    return datetime.now(UTC).date()


class UsageHost(Protocol):
    """What the usage part reads of the daemon (the daemon is one)."""

    config_dir: str
    registry: Any     # its state_dir
    telemetry: Any    # its metrics_path (the daemon's textfile), its sight's check_reporter
    background: Any   # spawn(coroutine, what)

    async def caller(self) -> Any: ...


class UsageKeeper:
    """The counts: to the database, to Prometheus, and the retention kept."""

    def __init__(self, host: UsageHost):
        self.host = host
        self.store = UsageStore(host.registry.state_dir)
        # [usage] retention_days as last read; None until lokid.toml could be read
        self.retention: int | None = None
        self.unread_said = False
        self.counts: dict[tuple[str, str], Counter[str]] = {}   # since the daemon started
        self.overflow_said = False
        self.textfile: Textfile | None = None
        self.prom_dirty = False
        self.prom_at = float("-inf")
        self.last_try = float("-inf")
        self.settings_at = float("-inf")
        self.purged: date | None = None
        self.failed: set[str] = set()   # what a tick could not do, said once each
        self.read_retention()
        self.purge(utc_today())

    def read_retention(self) -> None:
        """lokid.toml's ``[usage] retention_days``. A broken lokid.toml keeps the last one
        read (its error is the presets' to report); at the daemon's start, none: nothing
        is deleted until the file says how long to keep (a typo must not cut a 365-day
        retention to the default 90)."""
        from ..core.config import files as cfg

        try:
            self.retention = cfg.load_global(self.host.config_dir).usage.retention_days
            self.unread_said = False
        except LokiError as e:
            if self.retention is None and not self.unread_said:
                self.unread_said = True
                log.warning("usage: no day is deleted until lokid.toml can be read (%s)", e)
        self.settings_at = time.monotonic()

    def purge(self, today: date) -> None:
        if self.retention is None:
            return
        gone = self.store.purge(rules.oldest_kept(today, self.retention))
        if gone:
            log.info("usage: %d counts of days older than %d days deleted (retention_days)",
                     gone, self.retention)
        self.purged = today

    async def report(self, rows: Any) -> None:
        """GatewayUsage's rows: checked, counted, written (one transaction)."""
        today = utc_today()
        cells = rules.check_rows(rows, today)
        oldest = "" if self.retention is None else \
            rules.oldest_kept(today, self.retention).isoformat()
        for (_, key, preset, counter), value in cells.items():
            pair = pair_of(self.counts, key, preset)
            if pair[0] != key and not self.overflow_said:
                self.overflow_said = True
                log.warning("usage: more than %d key and preset pairs since the daemon "
                            "started: Prometheus counts the others as key %s", len(self.counts),
                            pair[0])
            self.counts.setdefault(pair, Counter())[counter] += value
        self.prom_dirty = self.prom_dirty or bool(cells)
        self.last_try = time.monotonic()
        # in a thread, the adding too: the store's lock may be held by a purge or a slow
        # write, which must not stall the daemon's loop
        await asyncio.to_thread(self._keep, {c: v for c, v in cells.items() if c[0] >= oldest})

    def _keep(self, cells: dict[rules.Cell, int]) -> None:
        self.store.add(cells)
        self.store.flush()

    async def run(self) -> None:
        """Until the daemon stops: counts held by a fault written again, old days purged
        each UTC day, the Prometheus file kept fresh. At the end: a last write."""
        try:
            while True:
                await asyncio.sleep(TICK)
                await self._step("writing the usage counts held in memory", self._retry)
                await self._step("purging old usage days", self._purge_due)
                await self._step("the usage Prometheus file", self._write_prom)
        finally:
            self.store.close()
            if self.textfile is not None:
                self.textfile.close()

    async def _step(self, what: str, fn: Any) -> None:
        try:
            await fn()
            self.failed.discard(what)
        except Exception as e:  # a defect of ours: the daemon and the counts go on
            if what not in self.failed:
                self.failed.add(what)
                log.warning("%s: %s: %s", what, type(e).__name__, e)

    async def _retry(self) -> None:
        now = time.monotonic()
        if self.store.pending and now - self.last_try >= RETRY_EVERY:
            self.last_try = now
            await asyncio.to_thread(self.store.flush)

    async def _purge_due(self) -> None:
        today = utc_today()
        every = SETTINGS_EVERY if self.retention is not None else UNREAD_EVERY
        if time.monotonic() - self.settings_at >= every:
            await asyncio.to_thread(self.read_retention)
            self.purged = None
        if today != self.purged:
            await asyncio.to_thread(self.purge, today)

    async def _write_prom(self) -> None:
        path = usage_path(self.host.telemetry.metrics_path or "")
        if self.textfile is not None and self.textfile.path != path:
            await asyncio.to_thread(self.textfile.close)
            self.textfile = None
        if not path or not self.counts:
            return
        if self.textfile is None:
            self.textfile = Textfile(path)
        now = time.monotonic()
        if self.prom_dirty or now - self.prom_at >= PROM_REFRESH:
            self.prom_dirty, self.prom_at = False, now
            text = render(self.counts)
            await asyncio.to_thread(self.textfile.write, text)


def _queue(row: dict[str, Any]) -> dict[str, Variant]:
    return {k: Variant("u", v) if k == "waiting" else Variant("d", float(v))
            if k == "oldest_s" else Variant("s", str(v)) for k, v in row.items()}


def _row(row: dict[str, Any]) -> dict[str, Variant]:
    return {k: Variant("s", v) if isinstance(v, str) else Variant("t", int(v))
            for k, v in row.items()}


class UsageInterface(ServiceInterface):
    """org.lokid.Lokid1.Usage: it only delegates to its :class:`UsageKeeper`."""

    def __init__(self, backend: Any, keeper: UsageKeeper | None = None):
        super().__init__(USAGE_INTERFACE)
        self.backend = backend
        self.keeper = keeper
        # one Usage question at a time: anyone may ask, and a question over every day
        # kept may take seconds (5 s for 3.6 million cells here); callers wait here, in
        # the loop, not in worker threads the daemon's own writes need
        self.asking = asyncio.Semaphore(1)
        self.queues = waiting.Queues()   # the gateway's last ReportQueues

    async def _reporter(self, member: str) -> UsageKeeper:
        """The keeper, for root, this daemon's user and the gateway's user only."""
        caller = await self.backend.caller()
        if caller is not None and getattr(caller, "name", "") != GATEWAY_USER:
            raise PermissionDeniedError(
                f"{member}: only the gateway (user {GATEWAY_USER}) or root may call it "
                f"(uid {getattr(caller, 'uid', '?')} is neither)")
        assert self.keeper is not None
        return self.keeper

    @method()
    @access(MANAGE)
    @guarded
    async def GatewayUsage(self, rows: "a(sssa{st})") -> None:
        keeper = await self._reporter("GatewayUsage")
        await keeper.report(rows)

    @method()
    @access(MANAGE)
    @guarded
    async def ReportQueues(self, rows: "a(ssbuds)") -> None:
        await self._reporter("ReportQueues")
        now = time.monotonic()
        if self.queues.report(waiting.check_rows(rows), now,
                              getattr(self.backend.registry, "presets", None)):
            self.emit_properties_changed({"Queues": [_queue(r)
                                                     for r in self.queues.shown(now)]})

    @dbus_property(access=PropertyAccess.READ)
    def Queues(self) -> "aa{sv}":
        return [_queue(r) for r in self.queues.shown(time.monotonic())]

    @method()
    @access(READ)
    @guarded
    async def Usage(self, query: "a{sv}") -> "aa{sv}":
        assert self.keeper is not None
        q = rules.parse_query(plain(query))
        async with self.asking:
            sums = await asyncio.to_thread(self.keeper.store.sums, q)
        return [_row(r) for r in rules.answer(q, sums)]

    @method()
    @access(MANAGE)
    @guarded
    async def KeyTotals(self) -> "a{s(tt)}":
        keeper = await self._reporter("KeyTotals")
        totals = await asyncio.to_thread(keeper.store.key_totals, utc_today())
        return {k: [d, m] for k, v in totals.items() for d, m in [v]}


def make(backend: Any) -> UsageInterface:
    """The interface for the daemon, its keeper running in the daemon's background."""
    keeper = UsageKeeper(backend)
    backend.background.spawn(keeper.run(), "keeping the gateway's usage")
    return UsageInterface(backend, keeper)


FACTORIES.append(make)
