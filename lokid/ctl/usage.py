"""``lokictl usage``: who used what, from the counts the daemon keeps (the Usage method of
``org.lokid.Lokid1.Usage``, :mod:`lokid.dbus.usage`; issue 46, item 2).

One line per key (``--by preset``, ``--by day``, or several: ``--by key,preset``):
requests, refusals, prompt tokens (the whole prompt, cached included), cached, generated,
the time waiting in the gateway's queue and the time in the engine. ``--since``/``--until``
take a UTC day (``2026-12-01``), ``today``, or ``7d`` (today and the 6 days before);
without them, every day kept (``[usage] retention_days``). ``--json``: the daemon's rows,
as they come.
"""

from __future__ import annotations

import json
import re
from datetime import UTC, date, datetime, timedelta
from typing import Any

from dbus_fast import Variant

from ..core.names import OBJECT_PATH, USAGE_INTERFACE
from ..core.serve.tables import span_text
from ..host.buscall import plain
from .client import EXIT_OK, EXIT_USAGE, Client, CtlError

GROUPS = ("day", "key", "preset")
COLUMNS = ("REQUESTS", "REFUSED", "PROMPT", "CACHED", "GENERATED", "WAIT", "ENGINE")
_DAYS = re.compile(r"(\d{1,5})d")


def day_of(text: str, option: str, today: date) -> str:
    """``--since``/``--until``'s value as YYYY-MM-DD; CtlError (usage) otherwise."""
    if text == "today":
        return today.isoformat()
    m = _DAYS.fullmatch(text)
    if m:
        n = int(m.group(1))
        if n < 1:
            raise CtlError(f"{option} {text}: at least 1d (today)", EXIT_USAGE)
        return (today - timedelta(days=n - 1)).isoformat()
    try:
        return date.fromisoformat(text).isoformat() if len(text) == 10 else _bad(option, text)
    except ValueError:
        return _bad(option, text)


def _bad(option: str, text: str) -> str:
    raise CtlError(f"{option} {text[:40]!r}: a day as YYYY-MM-DD (UTC), today, or Nd (the "
                   "last N days, today included)", EXIT_USAGE)


def groups_of(text: str) -> list[str]:
    by = [g.strip() for g in text.split(",") if g.strip()]
    if not by or any(g not in GROUPS for g in by) or len(set(by)) != len(by):
        raise CtlError(f"--by {text[:40]!r}: one or more of {', '.join(GROUPS)}, "
                       "comma-separated", EXIT_USAGE)
    return by


def query(by: str, key: str | None, preset: str | None, since: str | None,
          until: str | None, today: date) -> dict[str, Variant]:
    """The Usage method's query for lokictl's options."""
    q = {"by": Variant("as", groups_of(by))}
    for name, value in (("key", key), ("preset", preset)):
        if value:
            q[name] = Variant("s", value)
    for name, value in (("since", since), ("until", until)):
        if value:
            q[name] = Variant("s", day_of(value, f"--{name}", today))
    return q


def seconds_text(ms: int) -> str:
    return "0s" if not ms else f"{ms / 1000:.1f}s" if ms < 60_000 else span_text(ms / 1000)


def lines(rows: list[dict[str, Any]], by: list[str]) -> list[list[str]]:
    """The table's cells: a header, a line a row, and a total when there are several."""
    def cells(r: dict[str, Any]) -> list[str]:
        return [str(int(r.get(c, 0))) for c in ("requests", "refused", "prompt_tokens",
                                                "cached_tokens", "generated_tokens")] + \
            [seconds_text(int(r.get("wait_ms", 0))), seconds_text(int(r.get("engine_ms", 0)))]

    out = [[g.upper() for g in by] + list(COLUMNS)]
    out += [[str(r.get(g, "")) for g in by] + cells(r) for r in rows]
    if len(rows) > 1:
        total: dict[str, int] = {}
        for r in rows:
            for k, v in r.items():
                if isinstance(v, int):
                    total[k] = total.get(k, 0) + v
        out.append(["total"] + [""] * (len(by) - 1) + cells(total))
    return out


async def cmd_usage(c: Client, by: str, key: str | None, preset: str | None,
                    since: str | None, until: str | None, as_json: bool) -> int:
    from .stats import columns

    q = query(by, key, preset, since, until, datetime.now(UTC).date())
    (rows,) = await c._call(OBJECT_PATH, USAGE_INTERFACE, "Usage", "a{sv}", [q])
    found = [dict(plain(r)) for r in rows]
    if as_json:
        print(json.dumps(found, indent=2, ensure_ascii=False))
        return EXIT_OK
    if not found:
        print("no usage counted" + (" for this question" if len(q) > 1 else ""))
        return EXIT_OK
    print(columns(lines(found, list(plain(q["by"])))))
    return EXIT_OK
