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

Without systemd's watchdog (``lokid daemon`` by hand, the tests) nothing is pinged and
nothing is asked: the end of the connection alone says the bus is lost.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from dbus_fast import Message, MessageType
from dbus_fast.aio import MessageBus

log = logging.getLogger("lokid.daemon")


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
