"""lokid.store.state: the attempt token's peek/settle/clear semantics on a real SQLite file,
its behaviour under concurrent real processes, and real faults: a damaged file, a full
disk and a read-only file system (a size-limited tmpfs, mounted for the test)."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from support import REPO
from support.smallfs import fill, remount, small_tmpfs

from lokid.core.errors import StateError
from lokid.store import schema
from lokid.store.state import (
    FAILED_MAX,
    NEVER_ANSWERED,
    Mark,
    SavedBench,
    StateDB,
    StateReader,
    Token,
    Verdict,
    forget_cleared,
    note_cleared,
    read_cleared,
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
    for statement in schema.MIGRATIONS[0].sql.split(";"):
        raw.execute(statement)
    raw.execute("INSERT INTO failed VALUES ('p', 'm', 'layers in RAM', 1.0)")
    raw.execute("PRAGMA user_version = 1")
    raw.commit()
    raw.close()
    with StateDB(str(tmp_path)) as db:
        assert db.schema_version == schema.KNOWN
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
    assert db.schema_version == schema.KNOWN == 5
    raw = sqlite3.connect(db.path)
    assert raw.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    raw.execute("PRAGMA user_version = 99")
    raw.commit()
    raw.close()
    with pytest.raises(StateError, match="schema version 99, which only a newer lokid can use"):
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
    from lokid.store.state import Mark, StateDB, Verdict
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
        code = ("import sys, time; from lokid.store.state import StateDB\n"
                f"time.sleep(max(0, {start} - time.time()))\n"
                "StateDB(sys.argv[1]).close()")
        procs = [subprocess.Popen([sys.executable, "-c", code, str(tmp_path / str(round_))],
                                  stderr=subprocess.PIPE, text=True,
                                  env={**os.environ, "PYTHONPATH": str(ROOT)})
                 for _ in range(12)]
        for p in procs:
            _, err = p.communicate(timeout=60)
            assert p.returncode == 0, err


# --- faults: a damaged file --------------------------------------------------------------


def damage_page(path: Path, table: str) -> None:
    """Overwrite the root page of ``table`` (a page in the middle of the file) with garbage,
    as a bad sector or a torn copy would."""
    raw = sqlite3.connect(path)
    page = raw.execute("SELECT rootpage FROM sqlite_master WHERE name = ?", (table,)).fetchone()[0]
    size = raw.execute("PRAGMA page_size").fetchone()[0]
    count = raw.execute("PRAGMA page_count").fetchone()[0]
    raw.close()
    assert 1 < page < count  # neither the header page nor the last one
    with open(path, "r+b") as f:
        f.seek((page - 1) * size)
        f.write(os.urandom(size))


def written_db(state: Path) -> Path:
    """A real state database with a token, failures and a benchmark result, checkpointed
    into its file (the last connection closed)."""
    with StateDB(str(state)) as db:
        db.settle("p", A, Verdict(), attempt=True)
        for i in range(40):
            db.record_failure("p", Mark(f"fp{i}", "/e", 1), "layers in RAM " * 20)
        db.save_bench(SavedBench("p", {"mode": "quick"}, "m.gguf", "b11434", "fp1", 1.0))
    assert not (state / "state.db-wal").exists()
    return state / "state.db"


def aside(state: Path) -> list[Path]:
    return sorted(p for p in state.iterdir()
                  if p.name.startswith("state.db.damaged-") and not p.name.endswith(("-wal",
                                                                                     "-shm")))


def test_a_damaged_page_is_read_as_empty_by_the_reader_and_set_aside_by_a_writer(
        tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    path = written_db(tmp_path)
    damage_page(path, "attempt")
    damaged = path.read_bytes()

    with StateReader(str(tmp_path)) as reader:  # a peek: no traceback, nothing moved
        found = reader.peek("p", A)
        assert not found.why and "damaged" in found.pending, found
        assert "database disk image is malformed" in found.pending
        assert reader.token("p") is None
    assert path.read_bytes() == damaged and aside(tmp_path) == []

    with StateDB(str(tmp_path)) as db:  # the damage shows at the first query
        assert db.peek("p", A) == Verdict()
        [moved] = aside(tmp_path)
        assert moved.read_bytes() == damaged
        assert db.attempt("p") is None and db.failures("p") == [] and db.bench("p") is None
        db.settle("p", A, Verdict(), attempt=True)  # the new database works
        assert db.attempt("p") == A.key()
    err = capfd.readouterr().err
    assert len(err.splitlines()) == 1 and f"moved aside to {moved}," in err, err
    with StateDB(str(tmp_path)) as db:
        assert db.attempt("p") == A.key()
    assert len(aside(tmp_path)) == 1


def test_a_file_that_is_no_database_is_set_aside_with_its_wal_and_shm(
        tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "state.db").write_text("not a database\n" * 500)
    (tmp_path / "state.db-wal").write_bytes(b"wal" * 100)
    (tmp_path / "state.db-shm").write_bytes(b"shm" * 100)
    with StateReader(str(tmp_path)) as reader:
        assert "file is not a database" in reader.peek("p", A).pending
    with StateDB(str(tmp_path)) as db:  # on opening
        [moved] = aside(tmp_path)
        assert moved.read_text().startswith("not a database")
        assert Path(f"{moved}-wal").read_bytes() == b"wal" * 100
        assert Path(f"{moved}-shm").exists()  # an index SQLite rebuilds: its content varies
        assert db.schema_version == schema.KNOWN
        assert db.peek("p", A) == Verdict()
    err = capfd.readouterr().err
    assert "file is not a database" in err and f"moved aside to {moved}" in err, err


def test_every_method_works_on_a_database_damaged_under_it(tmp_path: Path) -> None:
    """No sqlite3 error escapes whichever method meets the damage first."""
    calls = {
        "peek": lambda db: db.peek("p", A),
        "token": lambda db: db.token("p"),
        "attempt": lambda db: db.attempt("p"),
        "failures": lambda db: db.failures("p"),
        "bench": lambda db: db.bench("p"),
        "effort": lambda db: db.effort("m", "high"),
        "settle": lambda db: db.settle("p", A, Verdict(), attempt=True),
        "clear": lambda db: db.clear("p", A),
        "record_failure": lambda db: db.record_failure("p", A, "x"),
        "clear_failures": lambda db: db.clear_failures("p"),
        "save_bench": lambda db: db.save_bench(SavedBench("p", {}, "m", "e", "f", 1.0)),
        "learn_effort": lambda db: db.learn_effort("m", "high", "medium"),
    }
    tables = {"peek": "attempt", "token": "attempt", "attempt": "attempt",
              "failures": "failed", "bench": "bench", "effort": "effort",
              "settle": "attempt", "clear": "attempt", "record_failure": "failed",
              "clear_failures": "failed", "save_bench": "bench", "learn_effort": "effort"}
    for name, call in calls.items():
        state = tmp_path / name
        path = written_db(state)
        with StateDB(str(state)) as db:
            db.learn_effort("m", "high", "low")
        damage_page(path, tables[name])
        with StateDB(str(state)) as db:
            call(db)
        assert len(aside(state)) == 1, name


OPENER = textwrap.dedent("""
    import os, sys, time
    from lokid.store.state import Mark, StateDB, Verdict
    state, preset, start, pause = sys.argv[1], sys.argv[2], float(sys.argv[3]), float(sys.argv[4])
    rename = os.rename
    def slow_rename(src, dst):  # the mover held up between moving state.db and its -wal
        rename(src, dst)
        if src.endswith("state.db"):
            time.sleep(pause)
    os.rename = slow_rename
    time.sleep(max(0, start - time.time()))
    with StateDB(state) as db:
        mark = Mark(preset, "/e", 1)
        db.settle(preset, mark, db.peek(preset, mark), attempt=True)
""")


@pytest.mark.parametrize("pause,stagger", [(0, 0), (0.5, 0.1)], ids=["together", "one-by-one"])
def test_helpers_finding_the_same_damage_at_once_set_it_aside_once(
        tmp_path: Path, pause: float, stagger: float) -> None:
    """Presets starting together at boot on a damaged database: one of them moves it aside,
    and the others use its new database (not move that one away too, losing its token).

    one-by-one: each helper starts a little after the one before, and the mover pauses
    between moving state.db and its -wal; a helper opening in that pause made the new
    database there, and the mover carried its live WAL (and its token) aside (CI, once)."""
    for round_ in range(3):
        state = tmp_path / str(round_)
        state.mkdir()
        (state / "state.db").write_bytes(os.urandom(8192))
        start = time.time() + 0.4
        procs = [subprocess.Popen([sys.executable, "-c", OPENER, str(state), f"p{i}",
                                   str(start + i * stagger), str(pause)],
                                  stderr=subprocess.PIPE, text=True,
                                  env={**os.environ, "PYTHONPATH": str(ROOT)})
                 for i in range(6)]
        for p in procs:
            _, err = p.communicate(timeout=60)
            assert p.returncode == 0 and "Traceback" not in err, err
        assert len(aside(state)) == 1
        with StateDB(str(state)) as db:
            assert [db.attempt(f"p{i}") for i in range(6)] == \
                [Mark(f"p{i}", "/e", 1).key() for i in range(6)]


# --- faults: a full disk, a read-only file system ------------------------------------------


@pytest.fixture
def small_fs(tmp_path: Path) -> Iterator[Path]:
    with small_tmpfs(tmp_path / "fs") as fs:
        yield fs


def test_a_full_disk_reads_the_database_and_cuts_automatic_speculation(small_fs: Path) -> None:
    with StateDB(str(small_fs)) as db:
        token = db.settle("p", A, Verdict(), attempt=True)
        db.save_bench(SavedBench("p", {"mode": "quick"}, "m.gguf", "b11434", "fp1", 1.0))
    filler = fill(small_fs)
    with StateDB(str(small_fs)) as db:  # opens (read-only) where it used to fail
        assert "No space left on device" in db.unwritable
        assert db.attempt("p") == A.key() and db.token("p") == token
        assert db.bench("p") is not None  # still read
        # the verdict on record comes first; without one, no token can be set: cut
        assert db.peek("p", A) == Verdict(NEVER_ANSWERED, False)
        cut = db.peek("p", A, cleared=token)
        assert cut.why == f"{db.unwritable}, and automatic speculation needs its attempt token"
        for write in (lambda: db.settle("p", A, Verdict(), attempt=True),
                      lambda: db.clear("p", A), lambda: db.record_failure("p", A, "x"),
                      lambda: db.learn_effort("m", "high", "low")):
            with pytest.raises(StateError, match="cannot be written .No space left on device"):
                write()
    with StateReader(str(small_fs)) as reader:
        assert reader.peek("p", A).why == NEVER_ANSWERED
        allowed = reader.peek("p", A, cleared=token)
        assert not allowed.why and "No space left on device" in allowed.pending
    filler.unlink()
    with StateDB(str(small_fs)) as db:
        assert db.unwritable == "" and db.peek("p", A, cleared=token) == Verdict()
        db.settle("p", A, Verdict(), attempt=False)
        assert db.attempt("p") is None


def test_a_write_that_meets_a_full_disk_is_a_state_error(small_fs: Path) -> None:
    """Another process holds the database open (its -shm exists): opening needs no space,
    and the disk fills under the write itself. That sqlite3 error used to escape."""
    with StateDB(str(small_fs)) as db:
        db.settle("p", A, Verdict(), attempt=True)
    holder = sqlite3.connect(small_fs / "state.db")
    try:
        holder.execute("SELECT * FROM attempt").fetchall()
        fill(small_fs)
        with StateDB(str(small_fs)) as db:
            assert db.unwritable == ""  # nothing told it yet
            with pytest.raises(StateError, match="cannot be written .No space left on device"):
                db.clear("p", A)
            assert db.attempt("p") == A.key()  # rolled back, and still read
    finally:
        holder.close()


def test_a_read_only_file_system_reads_the_database_and_refuses_writes(small_fs: Path) -> None:
    with StateDB(str(small_fs)) as db:
        db.record_failure("p", A_EDITED, "layers in RAM")
    remount(small_fs, "ro")
    try:
        with StateDB(str(small_fs)) as db:
            assert "Read-only file system" in db.unwritable
            assert db.peek("p", A_EDITED) == Verdict("layers in RAM", False)
            assert "needs its attempt token" in db.peek("p", A).why
            with pytest.raises(StateError, match="Read-only file system"):
                db.settle("p", A, Verdict(), attempt=True)
        with StateReader(str(small_fs)) as reader:
            assert "Read-only file system" in reader.peek("p", A).why
        assert sorted(os.listdir(small_fs)) == ["state.db"]  # nothing written
    finally:
        remount(small_fs, "rw")
    with StateDB(str(small_fs)) as db:
        assert db.peek("p", A) == Verdict()


def test_a_read_only_file_system_without_a_database_is_empty_and_unwritable(
        small_fs: Path) -> None:
    (small_fs / "state").mkdir()
    remount(small_fs, "ro")
    try:
        with StateDB(str(small_fs / "state")) as db:
            assert "Read-only file system" in db.unwritable
            assert db.attempt("p") is None and db.failures("p") == []
            assert "needs its attempt token" in db.peek("p", A).why
    finally:
        remount(small_fs, "rw")


# --- the runtime directory's note of a cleared token --------------------------------------


def test_a_token_noted_as_cleared_excuses_that_token_only(tmp_path: Path, db: StateDB) -> None:
    run = str(tmp_path / "run")
    assert read_cleared(run, "p") is None
    first = db.settle("p", A, Verdict(), attempt=True)
    assert first is not None and first.mark == A.key()
    note_cleared(run, "p", first)
    assert read_cleared(run, "p") == first
    assert db.peek("p", A, cleared=read_cleared(run, "p")) == Verdict()
    # a later launch of the same configuration that never answered: not excused
    second = db.settle("p", A, Verdict(), attempt=True)
    assert second != first
    assert db.peek("p", A, cleared=first) == Verdict(NEVER_ANSWERED, True)
    forget_cleared(run, "p")
    forget_cleared(run, "p")  # twice: nothing to forget
    assert read_cleared(run, "p") is None
    Path(run, "p.cleared").write_text("{not json")
    assert read_cleared(run, "p") is None  # damaged: none, the safe side
    Path(run, "p.cleared").write_text('{"mark": "m", "since": 1.5}')
    assert read_cleared(run, "p") == Token("m", 1.5)


def test_footprints_are_kept_per_key_and_a_damaged_record_is_measured_again(
        tmp_path: Path) -> None:
    from lokid.core.place.footprint import CGROUP, NVML, Footprint

    one = Footprint("k1", {"GPU0": 5 << 30, "host": 1 << 30}, {"GPU0": NVML, "host": CGROUP},
                    {"GPU0": 6 << 30}, 3.5, 100.0)
    with StateDB(str(tmp_path)) as db:
        assert db.footprint("p", "k1") is None
        db.save_footprint("p", one)
        assert db.footprint("p", "k1") == one
        assert db.footprint("p", "k2") is None      # another configuration: unknown
        assert db.footprint("q", "k1") is None
        for i in range(StateDB.FOOTPRINTS_KEPT + 3):
            db.save_footprint("p", Footprint(f"n{i}", {"GPU0": i + 1}, {"GPU0": NVML}))
        rows = sqlite3.connect(tmp_path / "state.db").execute(
            "SELECT count(*) FROM footprint WHERE preset = 'p'").fetchone()[0]
        assert rows == StateDB.FOOTPRINTS_KEPT
        assert db.footprint("p", f"n{StateDB.FOOTPRINTS_KEPT + 2}") is not None
        db.save_footprint("p", one)
        with sqlite3.connect(tmp_path / "state.db") as raw:
            raw.execute("UPDATE footprint SET record = ? WHERE key = 'k1'",
                        ('{"key": "k1", "held": {"GPU0": -5}}',))
        assert db.footprint("p", "k1") is None      # damaged: ignored, not an error
        db.save_footprint("p", one)
        assert db.move_preset("p", "renamed") >= 1
        assert db.footprint("renamed", "k1") == one and db.footprint("p", "k1") is None
        db.forget_preset("renamed")
        assert db.footprint("renamed", "k1") is None
