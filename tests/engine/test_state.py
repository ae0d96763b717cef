"""lokid.engine.state: the attempt token's peek/settle/clear semantics on a real SQLite file,
and its behaviour under concurrent real processes."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from support import REPO

from lokid.core.errors import StateError
from lokid.engine import state as state_module
from lokid.engine.state import (
    FAILED_MAX,
    NEVER_ANSWERED,
    Mark,
    SavedBench,
    StateDB,
    Verdict,
    verdict,
)

A = Mark("fp-a", "/usr/bin/llama-server", 11434)
A_NEW_BUILD = Mark("fp-a", "/usr/bin/llama-server", 11500)
A_EDITED = Mark("fp-a2", "/usr/bin/llama-server", 11434)
ROOT = REPO


@pytest.fixture
def db(tmp_path: Path) -> StateDB:
    with StateDB(str(tmp_path / "state")) as db:
        yield db


@pytest.mark.parametrize("attempt,failed,expected", [
    (None, {}, Verdict()),
    ("x", {}, Verdict()),
    ("m", {}, Verdict(NEVER_ANSWERED, True)),
    ("m", {"m": "layers in RAM"}, Verdict("layers in RAM", False)),
    (None, {"m": "layers in RAM"}, Verdict("layers in RAM", False)),
    (None, {"other": "x"}, Verdict()),
])
def test_verdict(attempt: str | None, failed: dict[str, str], expected: Verdict) -> None:
    assert verdict("m", attempt, failed) == expected


def test_an_auto_launch_that_never_answered_is_not_retried(db: StateDB) -> None:
    assert db.peek("p", A) == Verdict()
    db.settle("p", A, Verdict(), attempt=True)
    assert db.attempt("p") == A.key()
    # nothing cleared the token: the next start of the same mark is cut and records it
    found = db.peek("p", A)
    assert found == Verdict(NEVER_ANSWERED, True)
    db.settle("p", A, found, attempt=False)
    assert db.attempt("p") is None
    assert [(f.mark, f.reason) for f in db.failures("p")] == [(A.key(), NEVER_ANSWERED)]
    # and stays cut without a token
    assert db.peek("p", A) == Verdict(NEVER_ANSWERED, False)


def test_a_new_engine_build_or_an_edited_preset_retries(db: StateDB) -> None:
    db.settle("p", A, Verdict(), attempt=True)
    db.settle("p", A, db.peek("p", A), attempt=False)
    assert db.peek("p", A).why
    assert db.peek("p", A_NEW_BUILD) == Verdict()
    assert db.peek("p", A_EDITED) == Verdict()


def test_a_launch_that_answered_clears_its_token(db: StateDB) -> None:
    db.settle("p", A, Verdict(), attempt=True)
    assert db.clear("p", A)
    assert db.attempt("p") is None and db.peek("p", A) == Verdict()


def test_clear_removes_only_its_own_token(db: StateDB) -> None:
    db.settle("p", A_EDITED, Verdict(), attempt=True)
    assert not db.clear("p", A)  # an older launch's helper, late
    assert db.attempt("p") == A_EDITED.key()


def test_clear_with_a_reason_records_the_failure(db: StateDB) -> None:
    db.settle("p", A, Verdict(), attempt=True)
    assert db.clear("p", A, "only 30/65 layers on GPU")
    assert db.peek("p", A) == Verdict("only 30/65 layers on GPU", False)


def test_settle_without_auto_flags_sets_no_token(db: StateDB) -> None:
    db.settle("p", A, Verdict(), attempt=False)
    assert db.attempt("p") is None


def test_tokens_are_per_preset(db: StateDB) -> None:
    db.settle("a", A, Verdict(), attempt=True)
    db.settle("b", A, Verdict(), attempt=False)
    assert db.attempt("a") == A.key() and db.attempt("b") is None


def test_failed_marks_are_bounded_oldest_first(db: StateDB) -> None:
    for i in range(FAILED_MAX + 8):
        db.record_failure("p", Mark(f"fp{i}", "/e", 1), f"why {i}")
    kept = [f.mark for f in db.failures("p")]
    assert len(kept) == FAILED_MAX
    assert kept[0] == Mark("fp8", "/e", 1).key() and kept[-1] == Mark(f"fp{FAILED_MAX + 7}",
                                                                        "/e", 1).key()
    db.record_failure("q", A, "other preset")
    assert len(db.failures("p")) == FAILED_MAX


def test_clear_failures_keeps_the_token(db: StateDB) -> None:
    db.record_failure("p", A, "x")
    db.settle("p", A_EDITED, Verdict(), attempt=True)
    assert db.clear_failures("p") == 1 and db.failures("p") == []
    assert db.attempt("p") == A_EDITED.key()


def test_a_version_1_database_is_migrated_and_keeps_its_state(tmp_path: Path) -> None:
    raw = sqlite3.connect(tmp_path / "state.db")
    for statement in state_module._MIGRATIONS[0].split(";"):
        raw.execute(statement)
    raw.execute("INSERT INTO failed VALUES ('p', 'm', 'layers in RAM', 1.0)")
    raw.execute("PRAGMA user_version = 1")
    raw.commit()
    raw.close()
    with StateDB(str(tmp_path)) as db:
        assert db.schema_version == len(state_module._MIGRATIONS)
        assert [f.reason for f in db.failures("p")] == ["layers in RAM"]
        assert db.bench("p") is None


def test_bench_results_are_kept_per_preset_by_fingerprint(db: StateDB) -> None:
    result = {"mode": "quick", "prompt_per_second": 812.5}
    db.save_bench(SavedBench("p", result, "m.gguf", "b11434", "fp1", 10.0))
    db.save_bench(SavedBench("q", {"mode": "full"}, "n.gguf", "b11434", "fq", 20.0))
    saved = db.bench("p")
    assert saved is not None and saved.result == result and saved.model == "m.gguf"
    assert db.bench("p", fingerprint="fp1") == saved
    assert db.bench("p", fingerprint="fp-edited") is None  # another configuration
    assert db.bench("q") is not None and db.bench("p") == saved
    newer = SavedBench("p", {"mode": "full"}, "m.gguf", "b11434", "fp2", 30.0)
    db.save_bench(newer)
    assert db.bench("p") == newer and db.bench("p", fingerprint="fp1") is None


def test_a_learned_effort_translation_is_kept_per_model(db: StateDB) -> None:
    assert db.effort("qwen.gguf", "high") is None
    db.learn_effort("qwen.gguf", "high", "medium")
    db.learn_effort("other.gguf", "high", "")
    assert db.effort("qwen.gguf", "high") == "medium"
    assert db.effort("other.gguf", "high") == ""  # retried without the field
    assert db.effort("qwen.gguf", "low") is None


def test_schema_is_versioned_and_wal(tmp_path: Path, db: StateDB) -> None:
    assert db.schema_version == len(state_module._MIGRATIONS) == 3
    raw = sqlite3.connect(db.path)
    assert raw.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    raw.execute("PRAGMA user_version = 99")
    raw.commit()
    raw.close()
    with pytest.raises(StateError, match="schema version 99, newer than this lokid"):
        StateDB(os.path.dirname(db.path))


def test_reopening_keeps_the_state(tmp_path: Path) -> None:
    with StateDB(str(tmp_path)) as db:
        db.settle("p", A, Verdict(), attempt=True)
    with StateDB(str(tmp_path)) as db:
        assert db.attempt("p") == A.key()


def test_unwritable_state_dir_is_a_clear_error(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("")
    with pytest.raises(StateError, match="state database"):
        StateDB(str(tmp_path / "file" / "state"))


# --- real processes --------------------------------------------------------------------

WORKER = textwrap.dedent("""
    import sys
    from lokid.engine.state import Mark, StateDB, Verdict
    role, state, preset, fp, n = sys.argv[1:6]
    mark = Mark(fp, "/e", 1)
    with StateDB(state) as db:
        for _ in range(int(n)):
            if role == "prestart":
                db.settle(preset, mark, db.peek(preset, mark), attempt=True)
                # nobody else may take or change this preset's fresh token
                if db.attempt(preset) != mark.key():
                    print("LOST", db.attempt(preset), flush=True)
            else:
                db.clear(preset, mark)
""")


def spawn(role: str, state: Path, preset: str, fp: str, n: int) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-c", WORKER, role, str(state), preset, fp, str(n)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": str(ROOT)})


def finish(procs: list[subprocess.Popen[str]]) -> None:
    for p in procs:
        out, err = p.communicate(timeout=120)
        assert p.returncode == 0, err
        assert "LOST" not in out, out


def test_prestarts_of_different_presets_never_lose_a_token(tmp_path: Path) -> None:
    procs = [spawn("prestart", tmp_path, f"p{i}", f"fp{i}", 150) for i in range(3)]
    finish(procs)
    with StateDB(str(tmp_path)) as db:
        for i in range(3):
            assert db.attempt(f"p{i}") == Mark(f"fp{i}", "/e", 1).key()


def test_a_clear_racing_a_prestart_never_steals_the_newer_token(tmp_path: Path) -> None:
    """An old launch's helper keeps clearing its mark while a new launch settles
    another: the new token must survive every time (re-read under the lock)."""
    procs = [spawn("prestart", tmp_path, "p", "new", 150),
             spawn("clear", tmp_path, "p", "old", 300)]
    finish(procs)
    with StateDB(str(tmp_path)) as db:
        assert db.attempt("p") == Mark("new", "/e", 1).key()


def test_helpers_opening_a_new_state_db_at_once_all_succeed(tmp_path: Path) -> None:
    """Presets starting together at boot: their prestarts create the state DB at the
    same moment. Switching a new file to WAL failed there with "database is locked"
    (about one round in eight on this machine kind, before the fix); a few rounds
    of twelve processes each make that very likely to show."""
    for round_ in range(4):
        start = time.time() + 0.4  # every process opens the file at the same moment
        code = ("import sys, time; from lokid.engine.state import StateDB\n"
                f"time.sleep(max(0, {start} - time.time()))\n"
                "StateDB(sys.argv[1]).close()")
        procs = [subprocess.Popen([sys.executable, "-c", code, str(tmp_path / str(round_))],
                                  stderr=subprocess.PIPE, text=True,
                                  env={**os.environ, "PYTHONPATH": str(ROOT)})
                 for _ in range(12)]
        for p in procs:
            _, err = p.communicate(timeout=60)
            assert p.returncode == 0, err
