"""Who waits in this gateway, where and why, told to the daemon (issue 46, item 4).

Requests wait in two places: for their engine (:meth:`lokid.gateway.groups.Groups.turn`:
a cold start, a GPU group's swap, the placement's wait for memory) and, once it runs, at
its gate (:mod:`lokid.gateway.admission`: its slots busy, a key's ``max_in_flight``, the
slots kept for interactive keys). One reporter gathers both into rows per preset, key,
class and why (:mod:`lokid.core.serve.waiting`) and sends them with
``org.lokid.Lokid1.Usage.ReportQueues``; the daemon keeps the last (its ``Queues``
property: ``lokictl top``, the Cockpit page). Rules, each for the failure it prevents:

- **never a bus call per request**: a request waiting for its engine adds one entry to
  a dict and removes it (:meth:`Waiting.turn`); the gate's queues are read where they
  are (:class:`lokid.core.serve.fairshare.FairShare`). The rows are made once a second at most
  and sent only when a count or a why changed, again every
  :data:`lokid.core.serve.waiting.REPEAT` seconds while anything waits (the daemon forgets a
  word not repeated: a gateway killed mid-wait leaves nothing on show), and ``[]`` once
  nothing waits;
- **an older daemon is tolerated**: one without ``ReportQueues`` (``UnknownMethod``, or a
  bus policy that does not list it yet) is said once and asked again each minute; the
  placement's own ``ReportWaits`` (the manager's ``Waits``) goes on as before;
- **a report never stands in a request's way**: it runs in its own task, its faults are
  logged once until one goes through.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator
from typing import Any

from dbus_fast import DBusError
from dbus_fast.aio import MessageBus

from ..core.names import BUS_NAME, OBJECT_PATH, USAGE_INTERFACE
from ..core.serve.fairshare import UNLIMITED, FairShare
from ..core.serve.keys import Identity
from ..core.serve.waiting import REPEAT, Row, changed
from ..host.buscall import call
from .presets import Preset
from .report import OLD_DAEMON

log = logging.getLogger("lokid.gateway")

LOOK_EVERY = 1.0        # seconds between two looks at who waits
OLD_AGAIN = 60.0        # seconds before a daemon without ReportQueues is asked again


class Waiting:
    def __init__(self, bus: MessageBus, share: FairShare, groups: Any, placer: Any,
                 presets: Any):
        self.bus = bus
        self.share = share       # the gates' queues (lokid.gateway.admission)
        self.groups = groups     # lokid.gateway.groups.Groups: swaps
        self.placer = placer     # lokid.gateway.placer.Placer: waits for memory
        self.presets = presets   # lokid.gateway.presets.Presets: each preset's state
        # requests waiting for their engine: token → (preset, key, batch, since)
        self.before: dict[object, tuple[str, str, bool, float]] = {}
        self.sent: list[Row] = []
        self.sent_at = float("-inf")
        self.old_at = float("-inf")   # when the daemon last said it has no ReportQueues
        self.failure = ""
        self.task: asyncio.Task[None] | None = None

    @contextlib.asynccontextmanager
    async def turn(self, preset: Preset, ident: Identity) -> AsyncIterator[str]:
        """:meth:`Groups.turn` for ``ident``'s request, noted as waiting until it ends."""
        token = object()
        self.before[token] = (preset.name, ident.name, ident.batch, time.monotonic())
        try:
            async with self.groups.turn(preset, ident.batch) as url:
                self.before.pop(token, None)
                yield url
        finally:
            self.before.pop(token, None)

    # --- the rows ------------------------------------------------------------------------

    def rows(self, now: float) -> list[Row]:
        """Who waits now, one row per preset, key, class and why."""
        acc: dict[tuple[str, str, bool, str], tuple[int, float]] = {}

        def add(preset: str, key: str, batch: bool, why: str, n: int, since: float) -> None:
            had = acc.get((preset, key, batch, why))
            acc[(preset, key, batch, why)] = (n, since) if had is None else (
                had[0] + n, min(had[1], since))

        whys: dict[str, str] = {}
        for preset, key, batch, since in list(self.before.values()):
            why = whys.get(preset)
            if why is None:
                why = whys[preset] = self.engine_why(preset)
            add(preset, key, batch, why, 1, since)
        for preset, q in self.share.presets.items():
            for batch in (False, True):
                for key, line in q.waiting[batch].items():
                    if line:
                        add(preset, key, batch, self.gate_why(q, key, batch, line[0].limit),
                            len(line), line[0].since)
        return [Row(p, k, b, n, max(0.0, now - since), why)
                for (p, k, b, why), (n, since) in sorted(acc.items())]

    def engine_why(self, name: str) -> str:
        """Why a request waits for ``name``'s engine: a swap of its group, the placement's
        wait for memory (its own words), else its engine loading."""
        p = self.presets.presets.get(name)
        group = self.groups.groups.get(p.group) if p is not None and p.group else None
        if group is not None and (group.swapping or group.turn not in ("", name)):
            return f"swap (group {group.name} held by {group.turn or 'a swap'})"
        if any(w.preset == name for w in self.placer.waiting):
            said = self.placer.reported.get(name)
            return f"placement: {said}" if said else "placement (waiting for memory)"
        return "loading"

    def gate_why(self, q: Any, key: str, batch: bool, limit: int | None) -> str:
        if limit is not None and self.share.in_flight[key] >= limit:
            return f"max_in_flight of its key ({limit})"
        if q.slots >= UNLIMITED:
            return "waiting its turn"
        if batch and q.running < q.slots:
            return f"slots kept for interactive keys ({q.running}/{q.slots} busy)"
        return f"slots busy ({q.running}/{q.slots})"

    # --- the reports ---------------------------------------------------------------------

    def start(self) -> None:
        self.task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> None:
        """No more reports; the daemon told that nothing waits here (briefly)."""
        if self.task is not None:
            self.task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self.task
        if self.sent:
            with contextlib.suppress(TimeoutError, OSError, EOFError, DBusError):
                await asyncio.wait_for(self._send([]), 2.0)

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(LOOK_EVERY)
            try:
                await self.send(time.monotonic())
            except Exception as e:   # a defect of ours: requests go on being served
                log.warning("waits to lokid: %s: %s", type(e).__name__, e)

    async def send(self, now: float) -> None:
        """The rows, when they changed or are due again (see the rules)."""
        rows = self.rows(now)
        if not changed(self.sent, rows) and (not rows or now - self.sent_at < REPEAT):
            return
        if now - self.old_at < OLD_AGAIN:
            return
        try:
            await self._send(rows)
        except DBusError as e:
            if e.type in OLD_DAEMON:
                self.old_at = now
            if e.text != self.failure:
                log.info("lokid was not told who waits here (%s)", e.text)
                self.failure = e.text
            return
        if self.failure:
            log.info("lokid is told who waits here again")
            self.failure = ""
        self.sent, self.sent_at = rows, now

    async def _send(self, rows: list[Row]) -> None:
        await call(self.bus, BUS_NAME, OBJECT_PATH, USAGE_INTERFACE, "ReportQueues",
                   "a(ssbuds)", [[r.wire() for r in rows]])
