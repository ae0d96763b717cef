"""lokid.watch.journalread on real journal files (support.journalfiles): what the daemon
answers ReadLogs and StatsSince with under systemd."""

from __future__ import annotations

from pathlib import Path

import pytest
from support import DATA
from support.journalfiles import write_journal
from systemd import journal

from lokid.core.errors import InvalidArgsError
from lokid.core.telemetry.journalgap import JOURNAL_DROPPED
from lokid.core.telemetry.requestlog import EngineLog
from lokid.watch.journalread import MESSAGE_CHARS, match_unit, read_unit, window

UNIT = "loki-engine@demo.service"
T0 = 1_700_000_000_000_000
RECORDED = (DATA / "engine-logs" / "b11434-cpu-tiny-llama-ngram.log").read_text().splitlines()


def engine(unit: str, invocation: str, line: str) -> dict[str, str]:
    return {"MESSAGE": line, "_SYSTEMD_UNIT": unit, "_SYSTEMD_INVOCATION_ID": invocation,
            "SYSLOG_IDENTIFIER": "llama-server", "_TRANSPORT": "stdout"}


@pytest.fixture
def journal_file(tmp_path: Path) -> Path:
    entries = [{"MESSAGE": "Starting loki-engine@demo.service", "UNIT": UNIT, "_PID": "1",
                "SYSLOG_IDENTIFIER": "systemd", "_TRANSPORT": "journal"},
               {"MESSAGE": "Starting other", "UNIT": "other.service", "_PID": "1",
                "SYSLOG_IDENTIFIER": "systemd", "_TRANSPORT": "journal"},
               {"MESSAGE": "planned: llama-server -m …", "_SYSTEMD_UNIT": UNIT,
                "_SYSTEMD_INVOCATION_ID": "a" * 32, "SYSLOG_IDENTIFIER": "lokid",
                "LOKI_PRESET": "demo", "_TRANSPORT": "journal"}]
    entries += [engine(UNIT, "a" * 32, line) for line in RECORDED]
    entries += [engine("loki-engine@other.service", "b" * 32, "other's line")]
    entries += [engine(UNIT, "a" * 32, "x" * 10000)]
    return write_journal(tmp_path / "t.journal", entries, T0, 1_000_000)  # a second apart


def reader(path: Path) -> journal.Reader:
    return journal.Reader(files=[str(path)])


def test_the_last_lines_then_what_follows_the_cursor(journal_file: Path) -> None:
    lines, cursor = read_unit(reader(journal_file), UNIT, "", 3)
    assert [m for _, _, m in lines[:2]] == RECORDED[-2:]
    assert lines[2][2] == "x" * (MESSAGE_CHARS - 1) + "…"   # a long line is cut
    assert [who for _, who, _ in lines] == ["llama-server"] * 3
    assert lines[0][0] == T0 + (3 + len(RECORDED) - 2) * 1_000_000
    assert read_unit(reader(journal_file), UNIT, cursor, 10) == ([], cursor)  # nothing new
    # from the start: the unit's own entries and systemd's about it, no other unit's
    every, _ = read_unit(reader(journal_file), UNIT, "", 10000)
    assert [m for _, _, m in every[:2]] == ["Starting loki-engine@demo.service",
                                             "planned: llama-server -m …"]
    assert [who for _, who, _ in every[:2]] == ["systemd", "lokid"]
    assert len(every) == 2 + len(RECORDED) + 1
    assert not any("other" in m for _, _, m in every)
    # following: a cursor in the middle gives what came after it, in order, in bounded steps
    _, cursor = read_unit(reader(journal_file), UNIT, "", 1)
    head, _ = read_unit(reader(journal_file), UNIT, "", len(every) - 5)
    assert head == every[5:]
    r = reader(journal_file)
    match_unit(r, UNIT)
    r.seek_head()
    early = [r.get_next()["__CURSOR"] for _ in range(4)][-1]   # the 4th entry's
    rest, end = read_unit(reader(journal_file), UNIT, early, 3)
    assert rest == every[4:7]
    more, last = read_unit(reader(journal_file), UNIT, end, 100000)
    assert rest + more == every[4:] and last == cursor


def test_a_cursor_the_journal_does_not_know_is_invalid(journal_file: Path) -> None:
    with pytest.raises(InvalidArgsError, match="not a journal cursor"):
        read_unit(reader(journal_file), UNIT, "s=garbage", 10)


def test_the_window_counts_the_requests_of_the_daemons_parser(journal_file: Path) -> None:
    log = EngineLog()
    expected = [r for r in (log.feed(line, 0.0) for line in RECORDED) if r is not None]
    expected += log.flush(0.0)
    assert expected  # the recorded log holds a request
    now = T0 / 1e6 + 3600
    stats = window(reader(journal_file), UNIT, T0 / 1e6 - 60, now=now)
    assert stats["requests"] == len(expected) and stats["starts"] == 1, stats
    assert stats["generated_tokens"] == sum(r.gen_tokens for r in expected), stats
    after = window(reader(journal_file), UNIT, T0 / 1e6 + 10000, now=now)
    assert after.get("requests", 0) == 0 and after["starts"] == 0
    cut = window(reader(journal_file), UNIT, T0 / 1e6 - 60, now=now, limit=5)
    assert cut["truncated_at"] == pytest.approx(T0 / 1e6 + 5) and cut.get("requests", 0) == 0


def test_the_window_says_the_lines_journald_dropped(tmp_path: Path) -> None:
    """Issue 45, item 9: journald's own entry about the unit (as a real journald writes
    it: tests/watch/test_journal_limits_systemd.py) makes the window's counts a lower
    bound, with the lines missed; one about another unit does not."""
    def suppressed(unit: str, count: int) -> dict[str, str]:
        return {"MESSAGE": f"Suppressed {count} messages from {unit}",
                "MESSAGE_ID": JOURNAL_DROPPED, "N_DROPPED": str(count),
                "_TRANSPORT": "driver", "_SYSTEMD_UNIT": "systemd-journald.service",
                "SYSLOG_IDENTIFIER": "systemd-journald", "OBJECT_SYSTEMD_UNIT": unit,
                "OBJECT_SYSTEMD_INVOCATION_ID": "a" * 32}
    entries = [engine(UNIT, "a" * 32, line) for line in RECORDED]
    entries += [suppressed(UNIT, 640), suppressed("loki-engine@other.service", 9),
                suppressed(UNIT, 60)]
    path = write_journal(tmp_path / "t.journal", entries, T0, 1_000_000)
    now = T0 / 1e6 + 3600
    stats = window(reader(path), UNIT, T0 / 1e6 - 60, now=now)
    assert stats["missed_lines"] == 700 and stats["requests_lower_bound"] is True, stats
    assert stats["requests"] >= 1
    later = window(reader(path), UNIT, T0 / 1e6 + len(RECORDED) + 5, now=now)
    assert "missed_lines" not in later   # the drops before the window are not its own
