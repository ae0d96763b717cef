"""Usage counts, the daemon's side: what the gateway may report, how long it is kept, and
how a question about it is read (issue 46, item 2).

The gateway counts each request where it entered, from the engine's own figures, and
hands the daemon its counts per (UTC day, key name, preset) at most once a second
(``org.lokid.Lokid1.Usage.GatewayUsage``, :mod:`lokid.dbus.usage`); the daemon keeps them
in ``usage.db`` (:mod:`lokid.store.usage`). Rules, each for the failure it prevents:

- a counter is one of :data:`COUNTERS` or ``refused_<code>`` for an HTTP status 400 to
  599 (:func:`counter_ok`): a free-form name would let a buggy or hostile reporter grow
  the database and the Prometheus file without bound;
- a key is named by :data:`lokid.core.serve.keys.NAME_RULE` (``anonymous`` among them), a key
  of the flat api_keys_file as ``keys-file:<8 hex>``, or ``-`` (a request refused before
  its key was known); a preset by the preset name rule, or ``-`` (no preset: a model
  nobody serves). Anything else is refused with the row's place, never stored;
- a value is at most :data:`MAX_VALUE` per row and a call at most :data:`MAX_ROWS` rows
  of at most :data:`MAX_COUNTERS` counters: one report covers one second, so more is a
  fault, and a day's cell can never overflow SQLite's 64-bit integers (10^12 x 86,400
  reports a day stays below 2^63 / 100). A sum over many days that would (a reporter at
  the bound every second for decades) is SQLite's "integer overflow", said as an error
  naming the database, never a wrong number;
- a day is ``YYYY-MM-DD`` (UTC) and at most one day ahead of the daemon's clock (a
  gateway a little ahead across midnight is fine; a year ahead is a broken clock whose
  rows would never expire);
- ``[usage] retention_days`` (lokid.toml, default 90, 0 to 36,500): a day older than
  that many days before today is deleted, at the daemon's start and once a day; the
  current month is always kept, whatever the setting, because the monthly token
  budgets (``KeyTotals``) are counted from it. 0 keeps today (and this month) only.

Part of the pure core: no I/O.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import date, timedelta
from typing import Any

from ..config.presetname import valid_preset_name
from ..config.tomlread import Checker
from ..errors import InvalidArgsError
from .keys import LEGACY_PREFIX, NAME_RULE

# The counters a row may carry (common to the gateway, lokid.gateway.usage).
REQUESTS = "requests"
TOKENS = ("prompt_tokens", "cached_tokens", "generated_tokens")
COUNTERS = (REQUESTS, *TOKENS, "wait_ms", "engine_ms", "peer_requests")
REFUSED_PREFIX = "refused_"
UNKNOWN = "-"                 # a key or preset not known (refused before it was)
MAX_ROWS = 4096               # rows of one GatewayUsage call
MAX_COUNTERS = 64             # counters of one row
MAX_VALUE = 10 ** 12          # one counter of one row
MAX_GROUPS = 50_000           # rows of one Usage answer
GROUPS = ("day", "key", "preset")
QUERY_KEYS = ("since", "until", "key", "preset", "by")
USAGE_KEYS = ("retention_days",)
DEFAULT_RETENTION_DAYS = 90
MAX_RETENTION_DAYS = 36_500
_REFUSED = re.compile(r"refused_([45]\d\d)")
_LEGACY = re.compile(re.escape(LEGACY_PREFIX) + r"[0-9a-f]{8}")
_DAY = re.compile(r"\d{4}-\d{2}-\d{2}")

Cell = tuple[str, str, str, str]   # (day, key, preset, counter)


@dataclass(frozen=True)
class UsageConfig:
    """lokid.toml's ``[usage]`` table."""
    retention_days: int = DEFAULT_RETENTION_DAYS


def parse_usage(c: Checker | None) -> UsageConfig:
    """The ``[usage]`` table (``c``: its checker, keys already checked; None: absent)."""
    if c is None:
        return UsageConfig()
    days = c.integer("retention_days", 0, MAX_RETENTION_DAYS,
                     f"days of usage kept, 0 to {MAX_RETENTION_DAYS}")
    return UsageConfig(DEFAULT_RETENTION_DAYS if days is None else days)


def counter_ok(name: str) -> bool:
    return name in COUNTERS or bool(_REFUSED.fullmatch(name))


def key_ok(name: str) -> bool:
    return name == UNKNOWN or bool(NAME_RULE.fullmatch(name)) or bool(_LEGACY.fullmatch(name))


def preset_ok(name: str) -> bool:
    return name == UNKNOWN or valid_preset_name(name)


def parse_day(text: str, what: str = "day") -> date:
    """A ``YYYY-MM-DD`` day; InvalidArgsError naming ``what`` otherwise."""
    if not isinstance(text, str) or not _DAY.fullmatch(text):
        raise InvalidArgsError(f"{what} {_shown(text)} is not a day as YYYY-MM-DD")
    try:
        return date.fromisoformat(text)
    except ValueError:
        raise InvalidArgsError(f"{what} {_shown(text)} is no such day") from None


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:40] + "…"


def check_rows(rows: Any, today: date) -> dict[Cell, int]:
    """GatewayUsage's rows, summed by cell (zeros left out); InvalidArgsError naming the
    first fault and its row, and nothing is taken from a call with a fault."""
    if len(rows) > MAX_ROWS:
        raise InvalidArgsError(f"GatewayUsage: {len(rows)} rows; at most {MAX_ROWS} a call")
    out: dict[Cell, int] = {}
    latest = today + timedelta(days=1)
    for i, row in enumerate(rows):
        day, key, preset, counts = row
        where = f"GatewayUsage: row {i}"
        if parse_day(day, f"{where}: day") > latest:
            raise InvalidArgsError(f"{where}: day {day} is after tomorrow (UTC): is the "
                                   "gateway's clock right?")
        if not key_ok(key):
            raise InvalidArgsError(f"{where}: key {_shown(key)} is no key name (letters, "
                                   f"digits, '.', '_', '@', '-'; {LEGACY_PREFIX}<8 hex>; or "
                                   f"'{UNKNOWN}')")
        if not preset_ok(preset):
            raise InvalidArgsError(f"{where}: preset {_shown(preset)} is no preset name "
                                   f"(or '{UNKNOWN}')")
        if len(counts) > MAX_COUNTERS:
            raise InvalidArgsError(f"{where}: {len(counts)} counters; at most {MAX_COUNTERS}")
        for name, value in counts.items():
            if not counter_ok(name):
                raise InvalidArgsError(f"{where}: counter {_shown(name)} is not one of "
                                       f"{', '.join(COUNTERS)}, refused_<HTTP status 400 "
                                       "to 599>")
            if not 0 <= int(value) <= MAX_VALUE:
                raise InvalidArgsError(f"{where}: {name} = {value} is more than one report "
                                       f"can hold (at most {MAX_VALUE})")
            if value:
                cell = (day, key, preset, name)
                out[cell] = out.get(cell, 0) + int(value)
    return out


def oldest_kept(today: date, retention_days: int) -> date:
    """The oldest day kept: ``retention_days`` before today, or the month's first day if
    that is earlier (this month's budgets are counted from it)."""
    return min(today - timedelta(days=retention_days), today.replace(day=1))


@dataclass(frozen=True)
class Query:
    """A Usage question: days from ``since`` to ``until`` (inclusive; "" for no bound),
    one key and one preset or all (""), grouped by ``by`` (some of :data:`GROUPS`)."""
    since: str = ""
    until: str = ""
    key: str = ""
    preset: str = ""
    by: tuple[str, ...] = ("key",)


def parse_query(query: Mapping[str, Any]) -> Query:
    """Usage's ``a{sv}`` (values already plain); InvalidArgsError naming the fault."""
    unknown = sorted(set(query) - set(QUERY_KEYS))
    if unknown:
        raise InvalidArgsError(f"Usage: unknown query key {_shown(unknown[0])}; valid: "
                               f"{', '.join(QUERY_KEYS)}")
    out: dict[str, Any] = {}
    for name in ("since", "until", "key", "preset"):
        value = query.get(name, "")
        if not isinstance(value, str):
            raise InvalidArgsError(f"Usage: {name} must be a string")
        out[name] = value
    for name in ("since", "until"):
        if out[name]:
            parse_day(out[name], f"Usage: {name}")
    if out["key"] and not key_ok(out["key"]):
        raise InvalidArgsError(f"Usage: key {_shown(out['key'])} is no key name")
    if out["preset"] and not preset_ok(out["preset"]):
        raise InvalidArgsError(f"Usage: preset {_shown(out['preset'])} is no preset name")
    by = query.get("by", ["key"])
    if isinstance(by, str):
        by = [by] if by else []
    if not isinstance(by, (list, tuple)) or any(b not in GROUPS for b in by) \
            or len(set(by)) != len(by):
        raise InvalidArgsError(f"Usage: by must list some of {', '.join(GROUPS)}, each once")
    return Query(out["since"], out["until"], out["key"], out["preset"],
                 tuple(g for g in GROUPS if g in by))


def matches(q: Query, cell: Cell) -> bool:
    day, key, preset, _ = cell
    return ((not q.since or day >= q.since) and (not q.until or day <= q.until)
            and (not q.key or key == q.key) and (not q.preset or preset == q.preset))


def group_of(q: Query, cell: Cell) -> tuple[str, ...]:
    return tuple(cell[GROUPS.index(g)] for g in q.by)


def answer(q: Query, sums: Mapping[tuple[tuple[str, ...], str], int]) -> list[dict[str, Any]]:
    """Usage's rows from ``sums`` ((group values, counter) → total), sorted by group:
    the group's fields, every counter of :data:`COUNTERS` (0 when none), each
    ``refused_<code>`` there is, and ``refused`` (their sum)."""
    rows: dict[tuple[str, ...], dict[str, Any]] = {}
    for (group, counter), value in sums.items():
        row = rows.get(group)
        if row is None:
            row = rows[group] = dict(zip(q.by, group, strict=True))
            row.update({c: 0 for c in COUNTERS})
            row["refused"] = 0
        row[counter] = row.get(counter, 0) + value
        if counter.startswith(REFUSED_PREFIX):
            row["refused"] += value
    if len(rows) > MAX_GROUPS:
        raise InvalidArgsError(f"Usage: {len(rows)} rows, more than {MAX_GROUPS}: ask for "
                               "fewer days, one key or one preset, or group by less")
    return [rows[g] for g in sorted(rows)]


def tokens(counter: str) -> bool:
    """Whether ``counter`` counts toward a key's budget (prompt and generated tokens)."""
    return counter in ("prompt_tokens", "generated_tokens")
