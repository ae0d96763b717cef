"""--since as journalctl takes it (lokid.core.timespec): systemd.time(7)'s forms."""

from __future__ import annotations

import datetime

import pytest

from lokid.core.timespec import parse_since

NOW = datetime.datetime(2026, 12, 1, 15, 30, 0).timestamp()
MIDNIGHT = datetime.datetime(2026, 12, 1).timestamp()


@pytest.mark.parametrize("text,expected", [
    ("10min ago", NOW - 600), ("10min", NOW - 600), ("-10min", NOW - 600),
    ("10 min ago", NOW - 600), ("1h30min", NOW - 5400), ("1h 30min ago", NOW - 5400),
    ("2 days ago", NOW - 2 * 86400), ("90", NOW - 90), ("+5min", NOW + 300),
    ("now", NOW), ("today", MIDNIGHT), ("yesterday", MIDNIGHT - 86400),
    ("tomorrow", MIDNIGHT + 86400),
    ("2026-12-01 10:00", datetime.datetime(2026, 12, 1, 10, 0).timestamp()),
    ("2026-12-01 10:00:30", datetime.datetime(2026, 12, 1, 10, 0, 30).timestamp()),
    ("2026-12-01T10:00", datetime.datetime(2026, 12, 1, 10, 0).timestamp()),
    ("2026-11-30", MIDNIGHT - 86400), ("10:00", MIDNIGHT + 36000),
    ("@1764583200", 1764583200.0), ("  10min   ago ", NOW - 600),
])
def test_systemd_forms(text: str, expected: float) -> None:
    assert parse_since(text, NOW) == pytest.approx(expected)


@pytest.mark.parametrize("text", ["", "10 parsecs ago", "soon", "2026-13-01", "10min ago ago",
                                  "@x", "1e9999 years", "99999999 years ago"])
def test_anything_else_names_the_valid_forms(text: str) -> None:
    with pytest.raises(ValueError) as e:
        parse_since(text, NOW)
    assert str(e.value).startswith(f"--since {text!r}: ") and '"10min ago"' in str(e.value)
