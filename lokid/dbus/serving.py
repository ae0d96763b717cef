"""The daemon's watchdog: WATCHDOG=1 means "serving org.lokid.Lokid1 on the bus".

A ping sent from the event loop alone says only that the loop turns. lokid once lost
its bus connection (dbus-fast ended it on a full socket buffer, issue 28, item 14)
and went on pinging from a loop that served nobody: systemd never restarted it, and
the gateway answered 503 until an operator did. The rules:

- Each ping follows a round trip through the bus: ``GetNameOwner(org.lokid.Lokid1)``
  answered with this connection's unique name. It goes out behind everything the
  daemon has queued, so it also proves that the daemon's writes get through and that
  the bus daemon reads them.
- No answer within one ping interval (a third of ``WatchdogSec=``): no ping this
  time. A stall shorter than ``WatchdogSec=`` costs nothing; a longer one is a
  daemon that serves nobody, and systemd's watchdog restarts it.
- An answer that the name is not ours (nobody's, or another connection's): the bus is
  lost at once (:meth:`Serving.check` says why), as is a connection that ends: the
  daemon exits non-zero, for ``Restart=on-failure`` to start it again (with no start
  limit in lokid.service, for this reason).

:func:`serve_until_lost` is the daemon's life: until SIGTERM/SIGINT, or until the
connection ends; :func:`close_parts` bounds what the daemon closes after a loss
(:data:`CLOSE_AFTER_LOSS`), so nothing that waits for the lost bus holds the exit.

Without systemd's watchdog (``lokid daemon`` by hand, the tests) nothing is pinged and
nothing is asked: the end of the connection alone says the bus is lost.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from dbus_fast import Message, MessageType
from dbus_fast.aio import MessageBus

from .wire import SafeMessageBus

log = logging.getLogger("lokid.daemon")

# How long the daemon, its bus lost, may take to close its parts before it exits
# (systemd restarts it at once after; TimeoutStopSec would wait 90 s).
CLOSE_AFTER_LOSS = 10.0


def owner_query(name: str) -> Message:
    return Message(destination="org.freedesktop.DBus", path="/org/freedesktop/DBus",
                   interface="org.freedesktop.DBus", member="GetNameOwner",
                   signature="s", body=[name])


class Serving:
    """Pings ``send`` ("WATCHDOG=1") every ``every`` seconds while ``bus`` answers that
    ``name`` is ours; calls ``lose(why)`` when it says the name is not."""

    def __init__(self, bus: MessageBus, name: str, every: float,
                 ping: Callable[[], None], lose: Callable[[str], None]) -> None:
        self.bus = bus
        self.name = name
        self.every = every
        self.ping = ping
        self.lose = lose
        self.unanswered = 0   # checks in a row without an answer, for the log

    async def check(self) -> bool | str:
        """True: serving; False: no answer in time; a string: the name is lost, why."""
        try:
            reply = await asyncio.wait_for(self.bus.call(owner_query(self.name)), self.every)
        except TimeoutError:
            return False
        except Exception as e:   # the connection ended: its end says why, not this
            log.debug("watchdog check: %s", e)
            return False
        if reply.message_type == MessageType.ERROR:
            return f"the bus says {self.name} has no owner ({reply.error_name})"
        owner = reply.body[0] if reply.body else ""
        if owner != self.bus.unique_name:
            return f"the bus says {self.name} is owned by {owner}, not by this daemon " \
                   f"({self.bus.unique_name})"
        return True

    async def run(self) -> None:
        while True:
            started = asyncio.get_running_loop().time()
            verdict = await self.check()
            if verdict is True:
                if self.unanswered:
                    log.info("the bus answers again, after %d unanswered watchdog checks",
                             self.unanswered)
                self.unanswered = 0
                self.ping()
            elif verdict is False:
                self.unanswered += 1
                if self.unanswered == 1:
                    log.warning("the bus has not answered within %.0f s: no watchdog ping "
                                "until it does", self.every)
            else:
                self.lose(verdict)
                return
            await asyncio.sleep(max(0.0, self.every - (asyncio.get_running_loop().time()
                                                       - started)))


async def serve_until_lost(bus: SafeMessageBus, stopping: asyncio.Event) -> str | None:
    """Until ``stopping`` is set (None) or the end of the bus connection (why it ended)."""
    loop = asyncio.get_running_loop()
    lost = loop.create_task(bus.lost())
    stopped = loop.create_task(stopping.wait())
    try:
        await asyncio.wait((lost, stopped), return_when=asyncio.FIRST_COMPLETED)
    finally:
        stopped.cancel()
        lost.cancel()
    if stopping.is_set() or not lost.done() or lost.cancelled():
        return None
    return lost.result()


async def close_parts(closing: Awaitable[None], bounded: bool) -> None:
    """Awaits ``closing``; ``bounded`` (the bus is lost): for CLOSE_AFTER_LOSS at most,
    and a failure is a line, for the exit systemd waits for goes on."""
    if not bounded:
        await closing
        return
    # The calls fail at once on a lost bus (wire.py); this is the bound.
    try:
        await asyncio.wait_for(closing, CLOSE_AFTER_LOSS)
    except Exception as e:
        log.warning("closing after the loss of the bus: %s",
                    f"{type(e).__name__}: {e}" if str(e) else type(e).__name__)
