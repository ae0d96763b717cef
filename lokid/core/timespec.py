"""Points in time as journalctl's ``--since`` takes them (systemd.time(7)), for lokictl.

``lokictl stats --since`` and ``lokictl logs --since`` send the daemon a point in time;
the operator writes it as they would for journalctl, so the forms are systemd's:

- a span back from now: ``10min ago``, ``-10min``, ``1h30min ago``, ``2 days ago``, and,
  as systemd's ``10min ago`` would be, the span alone (``10min``, ``1h30min``);
- ``+5min`` (ahead of now), ``now``, ``today``, ``yesterday``, ``tomorrow`` (midnight);
- a local date and time: ``2026-12-01 10:00``, ``2026-12-01 10:00:30``, ``2026-12-01``
  (midnight), ``2026-12-01T10:00``, or a time alone (``10:00``: today);
- ``@1764583200`` (seconds since the epoch).

Span units are systemd's: us/usec, ms/msec, s/sec/second(s), m/min/minute(s),
h/hr/hour(s), d/day(s), w/week(s), M/month(s) (30.44 days), y/year(s) (365.25 days);
a number alone is seconds. Anything else is a :class:`ValueError` with a message
that shows the valid forms.
"""

from __future__ import annotations

import datetime
import re

_UNITS = {
    "us": 1e-6, "usec": 1e-6, "µs": 1e-6,
    "ms": 1e-3, "msec": 1e-3,
    "s": 1.0, "sec": 1.0, "second": 1.0, "seconds": 1.0,
    "m": 60.0, "min": 60.0, "minute": 60.0, "minutes": 60.0,
    "h": 3600.0, "hr": 3600.0, "hour": 3600.0, "hours": 3600.0,
    "d": 86400.0, "day": 86400.0, "days": 86400.0,
    "w": 604800.0, "week": 604800.0, "weeks": 604800.0,
    "M": 2629800.0, "month": 2629800.0, "months": 2629800.0,
    "y": 31557600.0, "year": 31557600.0, "years": 31557600.0,
}
_PART = re.compile(r"\s*(\d+(?:\.\d+)?)\s*([A-Za-zµ]*)")
_DATE_FORMATS = ("%Y-%m-%d %H:%M:%S", "%Y-%m-%d %H:%M", "%Y-%m-%dT%H:%M:%S",
                 "%Y-%m-%dT%H:%M", "%Y-%m-%d")
_TIME_FORMATS = ("%H:%M:%S", "%H:%M")
FORMS = ('"10min ago", "-10min", "10min", "1h30min", "today", "yesterday", '
         '"2026-12-01 10:00", "10:00", "@1764583200"')
MAX_SPAN = 100 * 31557600.0   # a century: beyond it, a typo rather than a window


def span_seconds(text: str) -> float:
    """A systemd time span ("1h30min", "2 days", "90") in seconds; ValueError otherwise."""
    text = text.strip()
    if not text:
        raise ValueError("an empty time span")
    total, pos = 0.0, 0
    while pos < len(text):
        m = _PART.match(text, pos)
        if m is None or m.end() == pos:
            raise ValueError(f"{text!r} is not a time span")
        number, unit = m.groups()
        if unit and unit not in _UNITS:
            raise ValueError(f"{text!r}: unknown time unit {unit!r}")
        total += float(number) * _UNITS[unit or "s"]
        pos = m.end()
    if total > MAX_SPAN:
        raise ValueError(f"{text!r}: more than a century")
    return total


def _midnight(now: float, days: int) -> float:
    day = datetime.datetime.fromtimestamp(now).date() + datetime.timedelta(days=days)
    return datetime.datetime.combine(day, datetime.time()).timestamp()


def parse_since(text: str, now: float) -> float:
    """The point in time ``text`` names (seconds since the epoch), ``now`` being the
    current time; ValueError, naming the valid forms, when it names none."""
    spec = " ".join(text.split())
    try:
        return _parse(spec, now)
    except ValueError as e:
        raise ValueError(f"--since {text!r}: {e}; use a time as journalctl takes it, "
                         f"e.g. {FORMS}") from None


def _parse(spec: str, now: float) -> float:
    if not spec:
        raise ValueError("no time given")
    words = {"now": 0, "today": 0, "yesterday": -1, "tomorrow": 1}
    if spec in words:
        return now if spec == "now" else _midnight(now, words[spec])
    if spec.startswith("@"):
        try:
            return float(spec[1:])
        except ValueError:
            raise ValueError("@ takes seconds since the epoch") from None
    if spec.endswith(" ago"):
        return now - span_seconds(spec[:-4])
    if spec[0] in "+-":
        sign = 1 if spec[0] == "+" else -1
        return now + sign * span_seconds(spec[1:])
    for fmt in _DATE_FORMATS:
        try:
            return datetime.datetime.strptime(spec, fmt).timestamp()
        except ValueError:
            continue
    for fmt in _TIME_FORMATS:
        try:
            t = datetime.datetime.strptime(spec, fmt).time()
        except ValueError:
            continue
        day = datetime.datetime.fromtimestamp(now).date()
        return datetime.datetime.combine(day, t).timestamp()
    try:
        return now - span_seconds(spec)  # a span alone: as "SPAN ago" (systemd's habit)
    except ValueError:
        raise ValueError("not a time") from None
