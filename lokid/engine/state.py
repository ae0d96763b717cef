"""The state DB: attempt tokens and the memory of failed automatic launches.

An automatic speculative-decoding launch that takes the engine down must not
be replayed: under systemd it would restart in a loop, reloading tens of GB
each time. The engine helper cannot see its own failure (it may be killed, or
hang before answering), so before such a launch it sets a *token* for the
preset's *mark* (configuration fingerprint + engine path + engine build),
and whoever sees the engine answer clears it. A token still there at the next
start of the same mark means "never answered": automatic speculation is cut
for that mark and the reason recorded. A changed preset or a new engine
build is a new mark, so it retries; with nothing to clear the token, the next
start falls back to off, the safe side.

The order matters (each step answers a real bug of the reference):
- :meth:`StateDB.peek` only reads. A second start refused because the first
  is still loading (port taken) must not take the first one's token for a
  failure.
- :meth:`StateDB.settle`, once the port is known free, consumes the old
  token, records the failure if due, and sets a new token only if this
  launch adds automatic flags.
- :meth:`StateDB.clear` removes only the caller's own token, re-read under
  the write lock: another launch may have set a newer one meanwhile.

SQLite (stdlib) in WAL mode with a busy timeout; every write is one
``BEGIN IMMEDIATE`` transaction, so concurrent processes serialise. The
schema version lives in ``PRAGMA user_version`` and grows by migrations.
"""

from __future__ import annotations

import os
import sqlite3
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from ..core.attempt import NEVER_ANSWERED, Mark, Verdict, verdict
from ..core.errors import StateError

__all__ = ["NEVER_ANSWERED", "Mark", "Verdict", "verdict", "StateDB", "StateReader", "Failure",
           "SavedBench"]

DB_FILE = "state.db"
FAILED_MAX = 32          # failed marks kept per preset, oldest forgotten first
BUSY_TIMEOUT_MS = 10_000

# Migration n brings the schema from version n to n + 1.
_MIGRATIONS = [
    """
    CREATE TABLE attempt (
        preset  TEXT PRIMARY KEY,
        mark    TEXT NOT NULL,
        since   REAL NOT NULL
    );
    CREATE TABLE failed (
        preset  TEXT NOT NULL,
        mark    TEXT NOT NULL,
        reason  TEXT NOT NULL,
        at      REAL NOT NULL,
        PRIMARY KEY (preset, mark)
    );
    """,
    # 2: benchmark results (lokid.core.benchrules): the last complete one of each preset,
    # with what it measured. bench_last (the last one overall) was never read and is no
    # longer written; the next migration drops it. Not one of its own: a schema bump makes
    # an engine helper still running the previous release refuse the database at READY
    # (it refuses newer schemas), which only a change worth it should cost.
    """
    CREATE TABLE bench (
        preset       TEXT PRIMARY KEY,
        result       TEXT NOT NULL,
        model        TEXT NOT NULL,
        engine       TEXT NOT NULL,
        fingerprint  TEXT NOT NULL,
        at           REAL NOT NULL
    );
    CREATE TABLE bench_last (
        id      INTEGER PRIMARY KEY CHECK (id = 1),
        preset  TEXT NOT NULL,
        result  TEXT NOT NULL,
        at      REAL NOT NULL
    );
    """,
    # 3: reasoning-effort levels a model's chat template refused, and the one it took.
    """
    CREATE TABLE effort (
        model   TEXT NOT NULL,
        wanted  TEXT NOT NULL,
        used    TEXT NOT NULL,
        PRIMARY KEY (model, wanted)
    );
    """,
]


@dataclass(frozen=True)
class SavedBench:
    """A complete benchmark result as saved: what it measured, and when."""

    preset: str
    result: dict[str, object]
    model: str
    engine: str
    fingerprint: str
    at: float


@dataclass(frozen=True)
class Failure:
    mark: str
    reason: str
    at: float


def _create_for_dir_owner(path: str, state_dir: str) -> None:
    """A database root creates belongs to the state directory's owner (loki).

    The daemon runs as root and the engine units as loki, sharing the file. It is
    created empty (a valid SQLite database) and handed over before SQLite opens
    it: SQLite, run by root, then gives its -wal and -shm files to the
    database's owner too.
    """
    st = os.stat(state_dir)
    if st.st_uid == 0:
        return
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o640)
    except FileExistsError:
        return
    try:
        os.fchown(fd, st.st_uid, st.st_gid)
    except OSError:
        pass  # without CAP_CHOWN: the units will report the database unwritable
    finally:
        os.close(fd)


def _read(db: sqlite3.Connection, preset: str) -> tuple[str | None, dict[str, str]]:
    """The preset's attempt token and its marks recorded as failed."""
    row = db.execute("SELECT mark FROM attempt WHERE preset = ?", (preset,)).fetchone()
    failed = dict(db.execute("SELECT mark, reason FROM failed WHERE preset = ?", (preset,)))
    return (row[0] if row else None), failed


class StateReader:
    """A look at the state database that never creates, migrates or writes it.

    ``lokid plan`` uses it: it shows what the next start runs without changing
    anything, and may run as a user who can read the database but not write it.
    A database that does not exist yet holds no verdict.
    """

    def __init__(self, state_dir: str):
        self.path = os.path.join(state_dir, DB_FILE)
        self._db: sqlite3.Connection | None = None
        if not os.path.exists(self.path):
            return
        try:
            from urllib.parse import quote

            self._db = sqlite3.connect(f"file:{quote(self.path)}?mode=ro", uri=True,
                                       timeout=BUSY_TIMEOUT_MS / 1000, isolation_level=None)
            version = self._db.execute("PRAGMA user_version").fetchone()[0]
        except (OSError, sqlite3.Error) as e:
            raise StateError(f"state database {self.path}: {e}") from None
        if version > len(_MIGRATIONS):
            raise StateError(f"state database {self.path} has schema version {version}, "
                             f"newer than this lokid ({len(_MIGRATIONS)}): upgrade lokid")

    def close(self) -> None:
        if self._db is not None:
            self._db.close()

    def __enter__(self) -> StateReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def peek(self, preset: str, mark: Mark, loading: bool = False) -> Verdict:
        """Read-only verdict for the next launch of ``mark``."""
        if self._db is None:
            return Verdict()
        try:
            attempt, failed = _read(self._db, preset)
        except sqlite3.Error as e:
            raise StateError(f"state database {self.path}: {e}") from None
        return verdict(mark.key(), attempt, failed, loading)


class StateDB:
    """The state database of one ``$LOKI_STATE_DIR``."""

    def __init__(self, state_dir: str):
        self.path = os.path.join(state_dir, DB_FILE)
        try:
            os.makedirs(state_dir, exist_ok=True)
            if os.geteuid() == 0:
                _create_for_dir_owner(self.path, state_dir)
            self._db = sqlite3.connect(self.path, timeout=BUSY_TIMEOUT_MS / 1000,
                                       isolation_level=None)
            self._db.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
            self._wal()
            self._db.execute("PRAGMA synchronous = NORMAL")
            self._migrate()
        except (OSError, sqlite3.Error) as e:
            raise StateError(f"state database {self.path}: {e}") from None

    def _wal(self) -> None:
        """Switch to WAL (persistent: only the first opener of a new file changes it).

        Changing the journal mode needs the database to itself, and SQLite does not
        wait on its busy handler for that: two helpers opening a new state DB at
        once (two presets starting at boot) got "database is locked". Retried here
        within the busy timeout.
        """
        deadline = time.monotonic() + BUSY_TIMEOUT_MS / 1000
        while True:
            try:
                self._db.execute("PRAGMA journal_mode = WAL")
                return
            except sqlite3.OperationalError as e:
                if "locked" not in str(e) or time.monotonic() > deadline:
                    raise
                time.sleep(0.01)

    def close(self) -> None:
        self._db.close()

    def __enter__(self) -> StateDB:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @contextmanager
    def _write(self) -> Iterator[sqlite3.Connection]:
        """One write transaction, taken before reading (so reads are under the lock)."""
        try:
            self._db.execute("BEGIN IMMEDIATE")
        except sqlite3.Error as e:
            raise StateError(f"state database {self.path}: {e}") from None
        try:
            yield self._db
        except BaseException:
            self._db.execute("ROLLBACK")
            raise
        else:
            self._db.execute("COMMIT")

    def _migrate(self) -> None:
        with self._write() as db:
            version = db.execute("PRAGMA user_version").fetchone()[0]
            if version > len(_MIGRATIONS):
                raise StateError(f"state database {self.path} has schema version {version}, "
                                 f"newer than this lokid ({len(_MIGRATIONS)}): upgrade lokid")
            for n in range(version, len(_MIGRATIONS)):
                # executescript() would commit the transaction: one statement at a time
                for statement in _MIGRATIONS[n].split(";"):
                    if statement.strip():
                        db.execute(statement)
            db.execute(f"PRAGMA user_version = {len(_MIGRATIONS)}")

    @property
    def schema_version(self) -> int:
        return int(self._db.execute("PRAGMA user_version").fetchone()[0])

    def _record(self, db: sqlite3.Connection, preset: str, mark: str, why: str) -> None:
        db.execute("INSERT OR REPLACE INTO failed (preset, mark, reason, at) VALUES (?, ?, ?, ?)",
                   (preset, mark, why, time.time()))
        db.execute("""DELETE FROM failed WHERE preset = ? AND mark NOT IN (
                          SELECT mark FROM failed WHERE preset = ?
                          ORDER BY at DESC, rowid DESC LIMIT ?)""",
                   (preset, preset, FAILED_MAX))

    # --- the attempt token ---------------------------------------------------------

    def peek(self, preset: str, mark: Mark, loading: bool = False) -> Verdict:
        """Read-only verdict for the next launch of ``mark``."""
        attempt, failed = _read(self._db, preset)
        return verdict(mark.key(), attempt, failed, loading)

    def settle(self, preset: str, mark: Mark, found: Verdict, attempt: bool) -> None:
        """Once the port is free, just before launching: consume the old token, record
        the failure ``found`` by :meth:`peek` if due, set a token if ``attempt``."""
        with self._write() as db:
            db.execute("DELETE FROM attempt WHERE preset = ?", (preset,))
            if found.record:
                self._record(db, preset, mark.key(), found.why)
            if attempt:
                db.execute("INSERT INTO attempt (preset, mark, since) VALUES (?, ?, ?)",
                           (preset, mark.key(), time.time()))

    def clear(self, preset: str, mark: Mark, why: str = "") -> bool:
        """Remove ``mark``'s token, and only it; with ``why``, record ``mark`` as failed.

        Returns whether the token was there.
        """
        with self._write() as db:
            current, _ = _read(db, preset)
            if current != mark.key():
                return False
            db.execute("DELETE FROM attempt WHERE preset = ?", (preset,))
            if why:
                self._record(db, preset, mark.key(), why)
            return True

    def record_failure(self, preset: str, mark: Mark, why: str) -> None:
        """Record ``mark`` as failed whatever the token (a verdict from the journal)."""
        with self._write() as db:
            self._record(db, preset, mark.key(), why)

    def attempt(self, preset: str) -> str | None:
        return _read(self._db, preset)[0]

    def failures(self, preset: str) -> list[Failure]:
        rows = self._db.execute(
            "SELECT mark, reason, at FROM failed WHERE preset = ? ORDER BY at, rowid", (preset,))
        return [Failure(m, r, a) for m, r, a in rows]

    def clear_failures(self, preset: str) -> int:
        with self._write() as db:
            return db.execute("DELETE FROM failed WHERE preset = ?", (preset,)).rowcount

    # --- benchmark results -----------------------------------------------------------

    def save_bench(self, saved: SavedBench) -> None:
        """Keep a complete result as the preset's (replacing its previous one)."""
        import json

        blob = json.dumps(saved.result, sort_keys=True)
        with self._write() as db:
            db.execute("INSERT OR REPLACE INTO bench (preset, result, model, engine, "
                       "fingerprint, at) VALUES (?, ?, ?, ?, ?, ?)",
                       (saved.preset, blob, saved.model, saved.engine, saved.fingerprint,
                        saved.at))

    def bench(self, preset: str, fingerprint: str | None = None) -> SavedBench | None:
        """The preset's saved result; with ``fingerprint``, only if it measured that
        configuration (a preset whose model, GPUs or arguments changed shows nothing)."""
        import json

        row = self._db.execute("SELECT result, model, engine, fingerprint, at FROM bench "
                               "WHERE preset = ?", (preset,)).fetchone()
        if row is None or (fingerprint is not None and row[3] != fingerprint):
            return None
        return SavedBench(preset, json.loads(row[0]), row[1], row[2], row[3], row[4])

    def effort(self, model: str, wanted: str) -> str | None:
        """The level to send for ``wanted`` with ``model`` ("" = no field), if one was learned."""
        row = self._db.execute("SELECT used FROM effort WHERE model = ? AND wanted = ?",
                               (model, wanted)).fetchone()
        return None if row is None else str(row[0])

    def learn_effort(self, model: str, wanted: str, used: str) -> None:
        with self._write() as db:
            db.execute("INSERT OR REPLACE INTO effort (model, wanted, used) VALUES (?, ?, ?)",
                       (model, wanted, used))
