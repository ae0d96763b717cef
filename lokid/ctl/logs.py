"""``lokictl logs PRESET [-n N] [-f]`` and ``lokictl stats --since``, through
the daemon.

Group loki may not read the system journal; the daemon reads a preset's unit's journal
for the callers polkit allows (``Manager.ReadLogs``, ``Manager.StatsSince``, action
``org.lokid.lokid1.read-logs``). ``-f`` follows by polling with the cursor each reply
ends with, every :data:`FOLLOW_EVERY` seconds: no call stays open in the daemon.
``--since`` takes what ``journalctl --since`` takes (:mod:`lokid.core.timespec`); lokictl
reads it here, so that a typo is a usage error (exit 2) before any call.
"""

from __future__ import annotations

import asyncio
import datetime
import sys
import time
from typing import Any

from ..core.names import MANAGER_INTERFACE, OBJECT_PATH

FOLLOW_EVERY = 0.5
BATCH = 1000       # lines asked for per call while catching up or following
MAX_LINES = 10000  # the daemon's bound for one call
DEFAULT_LINES = 50


def since_or_usage(text: str, usage: Any) -> float:
    """The point in time ``text`` names; else a usage error (lokid.ctl.client.CtlError)."""
    from ..core.timespec import parse_since

    try:
        return parse_since(text, time.time())
    except ValueError as e:
        raise usage(str(e)) from None


def line_text(at_us: int, who: str, message: str) -> str:
    """One entry as journalctl's short format prints it (local time, identifier)."""
    stamp = datetime.datetime.fromtimestamp(at_us / 1e6).strftime("%b %d %H:%M:%S")
    return f"{stamp} {who}: {message}" if who else f"{stamp} {message}"


async def cmd_logs(c: Any, name: str, lines: int, follow: bool) -> int:
    """The preset's last ``lines`` entries; with ``follow``, what comes after, until
    Ctrl-C."""
    async def show(cursor: str, count: int) -> tuple[int, str]:
        entries, last = await c.manager("ReadLogs", "ssu", [name, cursor, count])
        for at, who, message in entries:
            print(line_text(int(at), str(who), str(message)))
        sys.stdout.flush()
        return len(entries), str(last)

    _, cursor = await show("", lines)
    while follow:
        await asyncio.sleep(FOLLOW_EVERY)
        count = BATCH
        while count == BATCH:   # a burst comes in several calls, at once
            count, cursor = await show(cursor, BATCH)
    return 0


async def stats_since(c: Any, name: str, since: float) -> dict[str, Any]:
    from ..host.buscall import plain

    (stats,) = await c._call(OBJECT_PATH, MANAGER_INTERFACE, "StatsSince", "sd",
                             [name, since])
    return dict(plain(stats))
