"""One preset's journal, read for a caller: its last lines, the lines after a cursor, and
the request figures of a past window.

Group loki manages the engines but may not read the system journal (journalctl says
"insufficient permissions"); the daemon may, and answers ``lokictl logs`` and
``lokictl stats --since`` for callers polkit allows (:mod:`lokid.dbus.logs`).

What a read gives, and what a fault gives its caller:

- :func:`read_unit` matches what ``journalctl -u UNIT`` shows: the unit's processes'
  entries (``_SYSTEMD_UNIT=``: the engine and lokid's own lines) and systemd's about the
  unit (``UNIT=`` from PID 1). Without a cursor, the last ``count`` entries; with one,
  up to ``count`` entries after it, oldest first, and the cursor of the last entry given
  (the same cursor when there is nothing new: the caller polls with it to follow). Every
  read is bounded: :data:`MAX_LINES` entries, each message cut to
  :data:`MESSAGE_CHARS`, :data:`MAX_BYTES` in all (a follower gets the rest next time).
  A cursor the journal does not take is :class:`InvalidArgsError`; a cursor whose
  entry has gone (rotated away) reads from the oldest entry after it.
- :func:`window` counts the engine's requests since a point in time with the daemon's
  own parser (each start, by invocation id, through its own :class:`EngineLog`), over at
  most :data:`MAX_WINDOW_ENTRIES` entries: past that the figures stop and
  ``truncated_at`` says where. Lines journald dropped in the window (its "Suppressed N
  messages from UNIT" entries, :mod:`lokid.core.telemetry.journalgap`; issue 45, item 9) are summed
  as ``missed_lines``, with ``requests_lower_bound``: the counts are at least, not exactly.

Reads block (the journal files): the daemon runs them in a worker thread, each with its
own reader.
"""

from __future__ import annotations

import datetime
import time
from typing import Any

from ..core.errors import InvalidArgsError
from ..core.names import SYSLOG_IDENTIFIER
from ..core.telemetry.journalgap import dropped, match_dropped

MAX_LINES = 10000
MESSAGE_CHARS = 4096
MAX_BYTES = 1 << 20
MAX_WINDOW_ENTRIES = 2_000_000

Line = tuple[int, str, str]   # (time in µs since the epoch, identifier, message)


def match_unit(reader: Any, unit: str) -> None:
    """What journalctl -u matches: the unit's own entries, and PID 1's about it."""
    reader.add_match(_SYSTEMD_UNIT=unit)
    reader.add_disjunction()
    reader.add_match(UNIT=unit, _PID="1")


def _line(entry: dict[str, Any]) -> tuple[Line, int]:
    message = entry.get("MESSAGE", "")
    if isinstance(message, bytes):
        message = message.decode("utf-8", "replace")
    message = str(message)
    if len(message) > MESSAGE_CHARS:
        message = message[:MESSAGE_CHARS - 1] + "…"
    stamp = entry.get("__REALTIME_TIMESTAMP")
    at = int(stamp.timestamp() * 1e6) if isinstance(stamp, datetime.datetime) else 0
    who = str(entry.get("SYSLOG_IDENTIFIER") or entry.get("_COMM") or "")
    return (at, who, message), len(message.encode("utf-8", "replace")) + len(who) + 16


def read_unit(reader: Any, unit: str, cursor: str, count: int) -> tuple[list[Line], str]:
    count = max(0, min(count, MAX_LINES))
    match_unit(reader, unit)
    out: list[Line] = []
    size = 0
    last = cursor
    if not cursor:
        reader.seek_tail()
        picked: list[tuple[Line, str]] = []
        while len(picked) < count:
            entry = reader.get_previous()
            if not entry:
                break
            line, cost = _line(entry)
            if size + cost > MAX_BYTES and picked:
                break
            size += cost
            picked.append((line, str(entry["__CURSOR"])))
        if not picked:
            return [], ""
        picked.reverse()
        return [line for line, _ in picked], picked[-1][1]
    try:
        reader.seek_cursor(cursor)
    except (OSError, ValueError):
        raise InvalidArgsError(f"cursor {cursor[:80]!r}: not a journal cursor this "
                               "journal knows (read again without one)") from None
    while len(out) < count:
        entry = reader.get_next()
        if not entry:
            break
        if str(entry["__CURSOR"]) == cursor:
            continue  # the reader's own last entry
        line, cost = _line(entry)
        if size + cost > MAX_BYTES and out:
            break
        size += cost
        out.append(line)
        last = str(entry["__CURSOR"])
    return out, last


def window(reader: Any, unit: str, since: float, kind: str = "",
           now: float | None = None, limit: int = MAX_WINDOW_ENTRIES) -> dict[str, Any]:
    """The figures of the unit's requests since ``since`` (seconds since the epoch), as
    the daemon's Stats computes them for a start, over every start in the window."""
    from ..core.telemetry.figures import summarize
    from ..core.telemetry.requestlog import EngineLog

    now = time.time() if now is None else now
    reader.add_match(_SYSTEMD_UNIT=unit)
    match_dropped(reader, unit)   # journald's word that it dropped some of them
    reader.seek_realtime(datetime.datetime.fromtimestamp(max(since, 0.0)))
    logs: dict[str, EngineLog] = {}
    requests = []
    first = None
    truncated = None
    seen = missed = 0
    at = since
    while True:
        entry = reader.get_next()
        if not entry:
            break
        seen += 1
        if seen > limit:
            truncated = at
            break
        stamp = entry.get("__REALTIME_TIMESTAMP")
        at = stamp.timestamp() if isinstance(stamp, datetime.datetime) else now
        lost = dropped(entry)
        if lost is not None:
            missed += lost[2]
            continue
        if entry.get("SYSLOG_IDENTIFIER") == SYSLOG_IDENTIFIER:
            continue  # lokid's own lines: not the engine's
        message = entry.get("MESSAGE")
        if isinstance(message, bytes):
            message = message.decode("utf-8", "replace")
        if not isinstance(message, str):
            continue
        first = at if first is None else first
        log = logs.setdefault(str(entry.get("_SYSTEMD_INVOCATION_ID", "")), EngineLog())
        for text in message.splitlines():
            r = log.feed(text, at)
            if r is not None:
                requests.append(r)
    end = truncated if truncated is not None else now
    for log in logs.values():
        requests.extend(log.flush(end))
    out = summarize(requests, first if first is not None else end, end, kind)
    out["starts"] = len(logs)
    out["since"] = since
    if truncated is not None:
        out["truncated_at"] = truncated
    if missed:
        out.update(missed_lines=missed, requests_lower_bound=True)
    return out
