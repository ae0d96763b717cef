"""lokid.core.wording: counts that agree with their noun."""

from __future__ import annotations

from lokid.core.wording import counted


def test_one_is_singular_and_every_other_count_plural() -> None:
    assert counted(1, "preset") == "1 preset"
    assert counted(0, "preset") == "0 presets"
    assert counted(2, "request") == "2 requests"
    assert counted(1, "entry", "entries") == "1 entry"
    assert counted(5, "entry", "entries") == "5 entries"
