"""The usage database (lokid.store.usage) on real files, and the rules it keeps
(lokid.core.serve.usage): a damaged file set aside, a newer schema never written, the counts
in memory bounded and read with the file's, the retention and lokid.toml's [usage]."""

from __future__ import annotations

import logging
import sqlite3
from datetime import date
from pathlib import Path

import pytest

from lokid.core.config.files import load_global
from lokid.core.errors import ConfigError, InvalidArgsError
from lokid.core.serve import usage as rules
from lokid.store import usage as store_mod
from lokid.store.usage import UsageStore

DAY = "2026-12-06"


def requests(store: UsageStore) -> dict[str, int]:
    q = rules.parse_query({"by": ["key"]})
    return {g[0]: v for (g, c), v in store.sums(q).items() if c == "requests"}


def test_counts_add_up_in_one_transaction_a_report(tmp_path: Path) -> None:
    store = UsageStore(str(tmp_path))
    store.add({(DAY, "alice", "qwen", "requests"): 2, (DAY, "bob", "qwen", "requests"): 1})
    assert store.flush() and store.written == 1
    store.add({(DAY, "alice", "qwen", "requests"): 3})
    assert requests(store) == {"alice": 5, "bob": 1}   # in memory, read with the file's
    assert store.flush() and store.written == 2 and not store.pending
    assert requests(store) == {"alice": 5, "bob": 1}
    assert (tmp_path / "usage.db").stat().st_mode & 0o777 == 0o600
    store.close()


def test_a_damaged_file_is_set_aside_and_a_new_one_started(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    (tmp_path / "usage.db").write_bytes(b"not a database at all " * 200)
    store = UsageStore(str(tmp_path))
    aside = [p.name for p in tmp_path.iterdir() if ".damaged-" in p.name]
    assert len(aside) == 1 and aside[0].startswith("usage.db.damaged-"), aside
    assert "is damaged" in caplog.text and "moved aside" in caplog.text
    store.add({(DAY, "alice", "qwen", "requests"): 1})
    assert store.flush() and requests(store) == {"alice": 1}
    store.close()


def test_damage_found_by_a_query_sets_the_file_aside_and_keeps_the_counts_in_memory(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    store = UsageStore(str(tmp_path))
    store.add({(DAY, f"k{i}", "qwen", "requests"): 1 for i in range(2000)})
    assert store.flush()
    store.close()
    with open(tmp_path / "usage.db", "r+b") as f:   # the table's pages, not the header
        f.seek(4096)
        f.write(b"\xff" * 4096 * 3)
    store = UsageStore(str(tmp_path))   # opens: the header is whole
    store.add({(DAY, "alice", "qwen", "requests"): 1})
    assert requests(store) == {"alice": 1}   # the file's days are lost, memory's are not
    assert "is damaged (database disk image is malformed): moved aside" in caplog.text
    assert store.flush() and requests(store) == {"alice": 1}
    assert len([p for p in tmp_path.iterdir() if ".damaged-" in p.name]) == 1
    store.close()


def test_a_newer_schema_is_never_written_and_the_counts_wait(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    with sqlite3.connect(tmp_path / "usage.db") as db:
        db.execute("PRAGMA user_version = 9")
    before = (tmp_path / "usage.db").read_bytes()
    store = UsageStore(str(tmp_path))
    store.add({(DAY, "alice", "qwen", "requests"): 4})
    assert not store.flush()
    assert "made by a newer lokid (schema 9" in store.unwritable
    assert "kept in memory" in caplog.text
    assert (tmp_path / "usage.db").read_bytes() == before
    assert store.pending == {(DAY, "alice", "qwen", "requests"): 4}
    store.close()


def test_the_counts_in_memory_are_bounded_and_a_loss_is_said(
        tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
        ) -> None:
    monkeypatch.setattr(store_mod, "MAX_PENDING", 3)
    with sqlite3.connect(tmp_path / "usage.db") as db:
        db.execute("PRAGMA user_version = 9")   # never written: everything waits
    store = UsageStore(str(tmp_path))
    store.add({(DAY, f"k{i}", "qwen", "requests"): 1 for i in range(5)})
    store.add({(DAY, "k0", "qwen", "requests"): 1})   # a cell already waiting still adds
    assert len(store.pending) == 3 and store.pending[(DAY, "k0", "qwen", "requests")] == 2
    assert "usage: 2 counts lost: 3 cells already wait" in caplog.text
    store.close()


def test_the_retention_keeps_this_month_and_key_totals_count_it(tmp_path: Path) -> None:
    store = UsageStore(str(tmp_path))
    for d in ("2026-09-30", "2026-11-05", "2026-12-01", DAY):
        store.add({(d, "alice", "qwen", "prompt_tokens"): 10,
                   (d, "alice", "qwen", "generated_tokens"): 1,
                   (d, "alice", "qwen", "cached_tokens"): 100})
    assert store.flush()
    today = date.fromisoformat(DAY)
    assert rules.oldest_kept(today, 30) == date(2026, 11, 6)
    assert rules.oldest_kept(today, 0) == date(2026, 12, 1)
    assert store.purge(rules.oldest_kept(today, 0)) == 6
    assert store.key_totals(today) == {"alice": (11, 22)}   # cached tokens are not counted
    store.close()


def test_rows_are_summed_by_cell_and_checked() -> None:
    today = date.fromisoformat(DAY)
    cells = rules.check_rows([[DAY, "alice", "qwen", {"requests": 1, "wait_ms": 0}],
                              [DAY, "alice", "qwen", {"requests": 2}],
                              ["2026-12-07", "keys-file:0123abcd", "-", {"refused_503": 1}]],
                             today)
    assert cells == {(DAY, "alice", "qwen", "requests"): 3,
                     ("2026-12-07", "keys-file:0123abcd", "-", "refused_503"): 1}
    with pytest.raises(InvalidArgsError, match="keys-file:0123ABCD"):
        rules.check_rows([[DAY, "keys-file:0123ABCD", "-", {}]], today)
    with pytest.raises(InvalidArgsError, match="after tomorrow"):
        rules.check_rows([["2026-12-08", "alice", "qwen", {}]], today)
    q = rules.parse_query({"by": "day", "since": "2026-12-01"})
    assert q.by == ("day",) and q.since == "2026-12-01"
    assert rules.parse_query({"by": []}).by == ()


def test_lokid_toml_usage_retention_days(tmp_path: Path) -> None:
    assert load_global(str(tmp_path)).usage.retention_days == 90
    (tmp_path / "lokid.toml").write_text("[usage]\nretention_days = 7\n")
    assert load_global(str(tmp_path)).usage.retention_days == 7
    (tmp_path / "lokid.toml").write_text("[usage]\nretention_days = -1\n")
    with pytest.raises(ConfigError) as e:
        load_global(str(tmp_path))
    assert "lokid.toml:2" in str(e.value) and "usage.retention_days" in str(e.value)
    assert "0 to 36500" in str(e.value)
    (tmp_path / "lokid.toml").write_text("[usage]\nretention = 7\n")
    with pytest.raises(ConfigError, match="unknown key"):
        load_global(str(tmp_path))


def test_faults_are_logged_once(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING)
    with sqlite3.connect(tmp_path / "usage.db") as db:
        db.execute("PRAGMA user_version = 9")
    store = UsageStore(str(tmp_path))
    for _ in range(3):
        store.add({(DAY, "alice", "qwen", "requests"): 1})
        store.flush()
    assert caplog.text.count("made by a newer lokid") == 1
    store.close()
