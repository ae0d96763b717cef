"""The state DB across releases: a newer additive schema stays usable by today's code,
release 0.1.0's database is migrated with everything it held, and release 0.1.0's own
code keeps using the database today's code wrote (the downgrade, and an engine helper
of the previous release still loading during an upgrade).

Release 0.1.0 is real here: its database comes from tests/data/release-0.1.0/state.sql
(made by that release's own code, then dumped), and its code is that release's
lokid/engine/state.py, kept verbatim as tests/data/release-0.1.0/state_py.txt.
"""

from __future__ import annotations

import sqlite3
import sys
import types
from pathlib import Path

import pytest

from lokid.core.errors import StateError
from lokid.core.launch.attempt import Mark, Verdict
from lokid.store import schema
from lokid.store.state import SavedBench, StateDB, StateReader

RELEASE_010 = Path(__file__).resolve().parent.parent / "data" / "release-0.1.0"
A = Mark("fp-a", "/usr/bin/llama-server", 11434)


def tables(path: Path) -> set[str]:
    with sqlite3.connect(path) as raw:
        return {r[0] for r in raw.execute("SELECT name FROM sqlite_master WHERE type='table'")}


def user_version(path: Path) -> int:
    with sqlite3.connect(path) as raw:
        return int(raw.execute("PRAGMA user_version").fetchone()[0])


def release_010_db(state_dir: Path) -> Path:
    path = state_dir / "state.db"
    with sqlite3.connect(path) as raw:
        raw.executescript((RELEASE_010 / "state.sql").read_text())
    return path


def release_010_module() -> types.ModuleType:
    """Release 0.1.0's state module, its imports pointed at today's same-named parts
    (lokid.core.errors is unchanged since; attempt is grouped under lokid.core.launch,
    issue 49; journal_log moved)."""
    source = (RELEASE_010 / "state_py.txt").read_text()
    source = source.replace("from ..core.attempt import", "from lokid.core.launch.attempt import")
    source = source.replace("from ..core.", "from lokid.core.").replace(
        "from .journallog import", "from lokid.host.journallog import")
    module = types.ModuleType("lokid_state_010")
    sys.modules[module.__name__] = module   # dataclasses look their module up
    exec(compile(source, "release-0.1.0/state.py", "exec"), module.__dict__)
    return module


def test_the_levels_of_the_known_migrations() -> None:
    assert schema.KNOWN == 5
    assert [schema.level_of(v) for v in range(6)] == [0, 1, 2, 3, 3, 3]
    assert not schema.MIGRATIONS[3].breaking   # version 4 is additive: 0.1.0 still reads it
    assert not schema.MIGRATIONS[4].breaking   # so is 5, the footprints


def test_a_new_database_says_its_version_level_and_release(tmp_path: Path) -> None:
    with StateDB(str(tmp_path)) as db:
        assert db.schema_version == 5
    assert user_version(tmp_path / "state.db") == 3   # what release 0.1.0 compares
    with sqlite3.connect(tmp_path / "state.db") as raw:
        assert dict(raw.execute("SELECT key, value FROM schema")) == {
            "version": "5", "level": "3", "needs": "0.1.0"}
    assert "bench_last" not in tables(tmp_path / "state.db")


def test_release_010s_database_is_migrated_with_everything_it_held(tmp_path: Path) -> None:
    path = release_010_db(tmp_path)
    assert "bench_last" in tables(path) and user_version(path) == 3
    with StateDB(str(tmp_path)) as db:
        assert db.schema_version == 5
        assert db.attempt("demo") == "fp-demo|/usr/bin/llama-server|11434"
        [failure] = db.failures("qwen")
        assert failure.reason == "the last automatic launch never answered"
        saved = db.bench("demo", fingerprint="fp-demo")
        assert saved is not None and saved.result == {"decode_tps": 42.5, "protocol": 2}
        assert db.effort("tiny.gguf", "high") == ""
    assert "bench_last" not in tables(path) and user_version(path) == 3


def future_additive(state_dir: Path) -> Path:
    """Today's database as a later release would leave it after an additive migration
    (version 6): a new table, and a new nullable column with a default on bench."""
    with StateDB(str(state_dir)) as db:
        db.settle("p", A, Verdict(), attempt=True)
        db.save_bench(SavedBench("other", {"x": 1}, "m.gguf", "b1", "fo", 1.0))
    path = state_dir / "state.db"
    with sqlite3.connect(path) as raw:
        raw.execute("CREATE TABLE future (k TEXT PRIMARY KEY, v TEXT)")
        raw.execute("INSERT INTO future VALUES ('kept', 'yes')")
        raw.execute("ALTER TABLE bench ADD COLUMN spread REAL DEFAULT 0.5")
        raw.execute("UPDATE bench SET spread = 0.1 WHERE preset = 'other'")
        raw.execute("UPDATE schema SET value = '6' WHERE key = 'version'")
    return path


def test_a_newer_additive_schema_is_read_and_written_by_todays_code(tmp_path: Path) -> None:
    path = future_additive(tmp_path)
    with StateReader(str(tmp_path)) as reader:
        assert not reader.unwritable and not reader.problem
        assert reader.token("p") is not None
    with StateDB(str(tmp_path)) as db:
        assert db.schema_version == 6                    # not lowered, not migrated
        assert not db.unwritable
        assert db.clear("p", A)
        db.record_failure("p", A, "layers in RAM")
        db.save_bench(SavedBench("p", {"decode_tps": 3.0}, "m.gguf", "b1", "fp", 2.0))
        saved = db.bench("p")
        assert saved is not None and saved.result == {"decode_tps": 3.0}
        assert [f.reason for f in db.failures("p")] == ["layers in RAM"]
    with sqlite3.connect(path) as raw:
        assert raw.execute("SELECT v FROM future").fetchall() == [("yes",)]
        spreads = dict(raw.execute("SELECT preset, spread FROM bench"))
    assert spreads == {"other": 0.1, "p": 0.5}   # a row written today takes the default
    assert user_version(path) == 3


def test_a_breaking_schema_is_refused_naming_the_release_to_run(tmp_path: Path) -> None:
    with StateDB(str(tmp_path)):
        pass
    path = tmp_path / "state.db"
    with sqlite3.connect(path) as raw:
        raw.executemany("UPDATE schema SET value = ? WHERE key = ?",
                        [("7", "version"), ("7", "level"), ("0.9.0", "needs")])
        raw.execute("PRAGMA user_version = 7")
    with pytest.raises(StateError, match=r"schema version 7, which only lokid 0\.9\.0 or "
                                         r"newer can use .*knows schema versions up to 5"):
        StateDB(str(tmp_path))
    with StateReader(str(tmp_path)) as reader:
        assert "lokid 0.9.0 or newer" in reader.unwritable
        assert reader.peek("p", A).why   # the next start cannot set a token: no automatic spec


def test_release_010_keeps_using_todays_database(tmp_path: Path) -> None:
    """The downgrade, and the previous release's engine helper reaching READY after the
    new daemon migrated the file: release 0.1.0 opens it, sees today's token, clears it
    and writes its own records, and today's code reads them back."""
    old = release_010_module()
    with StateDB(str(tmp_path)) as db:
        token = db.settle("p", A, Verdict(), attempt=True)
        db.save_bench(SavedBench("p", {"decode_tps": 9.0}, "m.gguf", "b1", "fp", 3.0))
    assert token is not None
    with old.StateDB(str(tmp_path)) as db010:
        assert db010.attempt("p") == A.key()
        assert db010.clear("p", A)
        db010.record_failure("q", A, "the last automatic launch never answered")
        saved = db010.bench("p")
        assert saved is not None and saved.result == {"decode_tps": 9.0}
    with StateDB(str(tmp_path)) as db:
        assert db.attempt("p") is None
        assert [f.reason for f in db.failures("q")] == ["the last automatic launch never answered"]
        assert db.schema_version == 5


def test_release_010_would_refuse_a_level_it_does_not_know(tmp_path: Path) -> None:
    """What the level protects: the same old code refuses a file whose user_version
    moved past its own 3 (as it refused today's version 4 before levels existed)."""
    old = release_010_module()
    with StateDB(str(tmp_path)):
        pass
    with sqlite3.connect(tmp_path / "state.db") as raw:
        raw.execute("PRAGMA user_version = 4")
    with pytest.raises(StateError, match="newer than this lokid"):
        old.StateDB(str(tmp_path))
