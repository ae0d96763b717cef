"""The local runner's last lines (lokid.core.telemetry.logring): bounded, read by cursor."""

from __future__ import annotations

from lokid.core.telemetry.logring import LINE_CHARS, LogRing


def test_lines_are_read_by_cursor_and_the_ring_keeps_its_bounds() -> None:
    ring = LogRing(keep_lines=5, keep_bytes=1000)
    assert ring.read("", 10) == ([], "")
    for i in range(8):
        ring.add(1.5, "llama-server", f"line {i}")
    lines, cursor = ring.read("", 2)
    assert lines == [(1_500_000, "llama-server", "line 6"), (1_500_000, "llama-server",
                                                               "line 7")]
    assert ring.read(cursor, 10) == ([], cursor)
    ring.add(2.0, "lokid", "line 8")
    assert ring.read(cursor, 10)[0] == [(2_000_000, "lokid", "line 8")]
    # only the last 5 are kept; a cursor of another ring (a daemon before) reads them all
    assert [t for _, _, t in ring.read("local:other:3", 10)[0]] == [f"line {i}"
                                                                   for i in range(4, 9)]
    ring.add(3.0, "llama-server", "y" * 100000)   # one line: cut, and the byte bound holds
    assert ring.read("", 1)[0][0][2] == "y" * (LINE_CHARS - 1) + "…"
    assert ring.size <= 1000 or len(ring.lines) == 1
