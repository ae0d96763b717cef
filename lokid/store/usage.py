"""The usage database: the gateway's counts per (UTC day, key name, preset, counter),
kept across restarts in ``$LOKI_STATE_DIR/usage.db`` (issue 46, item 2).

One writer, the daemon (lokid.service); nobody else opens the file, so unlike the state
DB (:mod:`lokid.store.state`) no lock between processes is needed. The rules (what a
row may hold, how long it is kept) are :mod:`lokid.core.serve.usage`'s; this module keeps
them on disk. Each step is there for a failure:

- counts are first added to :attr:`UsageStore.pending` (memory), then written in one
  ``BEGIN IMMEDIATE`` transaction (:meth:`UsageStore.flush`; one per GatewayUsage call,
  at most about one a second), and taken out of memory only once the COMMIT succeeded:
  a full disk, a read-only file system or a database that cannot even be created keeps
  the counts in memory, said once in the log, and a later flush (the next report, or
  the daemon's tick every few seconds) writes them. A full disk never stops the daemon
  and never loses a count it could hold: at most :data:`MAX_PENDING` cells wait (a
  cell: one day, key, preset and counter; a day of a team's traffic is some thousands),
  and what comes past that is counted as lost and said, never grown without bound;
- every read (:meth:`UsageStore.sums`, :meth:`UsageStore.key_totals`) adds the counts
  still in memory to the file's: a key's budget holds on a full disk too;
- SQLite in WAL mode with a busy timeout and ``synchronous = NORMAL`` (a power cut may
  lose the last second's counts, never the file), created mode 0600: key names and
  what they used are nobody else's business than the daemon's API's;
- a damaged file ("database disk image is malformed", "file is not a database"), met on
  opening or by any statement, is moved aside as ``usage.db.damaged-<UTC time>`` with its
  -wal and -shm, said in one warning, and a new one started: the days it held are lost,
  the counts in memory are not;
- a file of a newer schema (``user_version`` above :data:`SCHEMA`) is never written:
  counts stay in memory and the reason is said; a downgrade must not eat an upgrade's
  data;
- :meth:`UsageStore.purge` deletes the days older than the retention (at the daemon's
  start and once a day), in one statement on the primary key's first column.

Every public method says what a fault gives its caller; no ``sqlite3`` exception leaves
this module. The methods are blocking (run them in a thread) and serialised by a lock.
"""

from __future__ import annotations

import logging
import os
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from datetime import date
from typing import Any, TypeVar

from ..core.errors import StateError
from ..core.serve.usage import Cell, Query, group_of, matches, tokens
from .sqlfile import BUSY_TIMEOUT_MS, DAMAGED_SUFFIX, cause, is_damaged, use_wal

log = logging.getLogger("lokid.usage")
T = TypeVar("T")
Row = tuple[Any, ...]

DB_FILE = "usage.db"
SCHEMA = 1
MAX_PENDING = 200_000   # cells waiting in memory for a database that cannot be written
_CREATE = """CREATE TABLE IF NOT EXISTS usage (
    day TEXT NOT NULL, key TEXT NOT NULL, preset TEXT NOT NULL, counter TEXT NOT NULL,
    value INTEGER NOT NULL, PRIMARY KEY (day, key, preset, counter)) WITHOUT ROWID"""
_UPSERT = ("INSERT INTO usage (day, key, preset, counter, value) VALUES (?, ?, ?, ?, ?) "
           "ON CONFLICT (day, key, preset, counter) DO UPDATE SET value = value + excluded.value")


class UsageStore:
    def __init__(self, state_dir: str):
        self.state_dir = state_dir
        self.path = os.path.join(state_dir, DB_FILE)
        self.pending: dict[Cell, int] = {}
        self.lost = 0              # counts dropped past MAX_PENDING since the last warning
        self.unwritable = ""       # why the last write failed, "" when it succeeded
        self.written = 0           # transactions committed (the tests count them)
        self._db: sqlite3.Connection | None = None
        self._lock = threading.Lock()
        with self._lock:
            self._open()

    # --- the file ---------------------------------------------------------------------

    def _open(self) -> None:
        """Open (or create) the database; a damaged one is set aside once and replaced.
        On any other fault ``_db`` stays None, ``unwritable`` says why, and the next
        flush tries again."""
        for attempt in (1, 2):
            try:
                self._db = self._connect()
                self.unwritable = ""
                return
            except (OSError, sqlite3.Error, StateError) as e:
                self._close()
                if attempt == 1 and isinstance(e, sqlite3.Error) and is_damaged(e) \
                        and self._set_aside(e):
                    continue
                self._fail(e, "opened")
                return

    def _connect(self) -> sqlite3.Connection:
        os.makedirs(self.state_dir, exist_ok=True)
        try:
            os.close(os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC,
                             0o600))
        except FileExistsError:
            pass
        db = sqlite3.connect(self.path, timeout=BUSY_TIMEOUT_MS / 1000, isolation_level=None,
                             check_same_thread=False)
        try:
            db.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
            version = int(db.execute("PRAGMA user_version").fetchone()[0])
            if version > SCHEMA:
                raise StateError(f"the usage database {self.path} was made by a newer lokid "
                                 f"(schema {version}, this one knows {SCHEMA}): it is left as "
                                 "it is")
            use_wal(db)
            db.execute("PRAGMA synchronous = NORMAL")
            if version < SCHEMA:
                db.execute(_CREATE)
                db.execute(f"PRAGMA user_version = {SCHEMA}")
            return db
        except BaseException:
            db.close()
            raise

    def _close(self) -> None:
        if self._db is not None:
            self._db.close()
            self._db = None

    def _set_aside(self, e: BaseException) -> bool:
        """Move the damaged file (and its -wal, -shm) aside; whether a new one may be made."""
        self._close()
        aside = self.path + DAMAGED_SUFFIX + time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
        n = 1
        while os.path.lexists(aside + (f".{n}" if n > 1 else "")):
            n += 1
        aside += f".{n}" if n > 1 else ""
        try:
            os.rename(self.path, aside)
            for suffix in ("-wal", "-shm"):
                try:
                    os.rename(self.path + suffix, aside + suffix)
                except FileNotFoundError:
                    pass
        except OSError as oe:
            self.unwritable = (f"the usage database {self.path} is damaged ({e}) and cannot "
                               f"be moved aside ({oe.strerror})")
            log.warning("%s: the counts are kept in memory", self.unwritable)
            return False
        log.warning("the usage database %s is damaged (%s): moved aside to %s, and a new one "
                    "started (the days it held are lost; the counts not yet written are kept)",
                    self.path, e, aside)
        return True

    def _fail(self, e: BaseException, what: str) -> None:
        why = str(e) if isinstance(e, StateError) else \
            f"the usage database {self.path} cannot be {what} ({cause(e, self.state_dir)})"
        if why != self.unwritable:
            log.warning("%s: the usage counts are kept in memory, and written once it can be",
                        why)
        self.unwritable = why

    def _run(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        """``fn`` on the database (opened again if it was not); a damaged file is set aside
        and ``fn`` runs once on the new one. Raises sqlite3.Error, OSError or StateError."""
        for attempt in (1, 2):
            if self._db is None:
                self._db = self._connect()
            try:
                return fn(self._db)
            except sqlite3.Error as e:
                if attempt == 1 and is_damaged(e) and self._set_aside(e):
                    continue
                raise
        raise AssertionError("unreachable")

    # --- writing ------------------------------------------------------------------------

    def add(self, cells: Mapping[Cell, int]) -> None:
        """Counts to write: added to those in memory (never an error)."""
        with self._lock:
            for cell, value in cells.items():
                if cell in self.pending:
                    self.pending[cell] += value
                elif len(self.pending) < MAX_PENDING:
                    self.pending[cell] = value
                else:
                    self.lost += value
            if self.lost:
                log.warning("usage: %d counts lost: %d cells already wait for the database "
                            "(%s)", self.lost, MAX_PENDING, self.unwritable or "busy")
                self.lost = 0

    def flush(self) -> bool:
        """Write the counts in memory in one transaction; whether they are all on disk now.
        A fault keeps them in memory, is logged once (until a write succeeds) and is
        never raised."""
        with self._lock:
            if not self.pending:
                return True
            taken = dict(self.pending)

            def write(db: sqlite3.Connection) -> None:
                db.execute("BEGIN IMMEDIATE")
                try:
                    db.executemany(_UPSERT, [(*cell, v) for cell, v in taken.items()])
                    db.execute("COMMIT")
                except BaseException:
                    if db.in_transaction:
                        try:
                            db.execute("ROLLBACK")
                        except sqlite3.Error:
                            pass
                    raise

            try:
                self._run(write)
            except (OSError, sqlite3.Error, StateError) as e:
                self._fail(e, "written")
                return False
            for cell, value in taken.items():
                left = self.pending[cell] - value
                if left:
                    self.pending[cell] = left
                else:
                    del self.pending[cell]
            self.written += 1
            if self.unwritable:
                log.info("the usage database %s is written again (%d cells from memory)",
                         self.path, len(taken))
                self.unwritable = ""
            return not self.pending

    def purge(self, oldest: date) -> int:
        """Delete the days before ``oldest`` (file and memory); how many cells went. A
        fault is logged and gives 0 (the next purge tries again)."""
        cutoff = oldest.isoformat()
        with self._lock:
            gone = [c for c in self.pending if c[0] < cutoff]
            for cell in gone:
                del self.pending[cell]
            try:
                deleted: int = self._run(lambda db: db.execute(
                    "DELETE FROM usage WHERE day < ?", (cutoff,)).rowcount)
            except (OSError, sqlite3.Error, StateError) as e:
                self._fail(e, "written")
                return len(gone)
            return len(gone) + deleted

    # --- reading ------------------------------------------------------------------------

    def _read(self, sql: str, args: tuple[str, ...]) -> list[Row]:
        """Rows of ``sql``; [] when there is no database yet (none, or an empty file the
        disk had no room to make one in). StateError naming the file and the cause when
        it cannot be read."""
        if self._db is None and _size(self.path) == 0:
            return []
        try:
            rows: list[Row] = self._run(lambda db: db.execute(sql, args).fetchall())
            return rows
        except (OSError, sqlite3.Error, StateError) as e:
            if self._db is None and _size(self.path + "-wal") == 0:
                # cannot be opened for writing (a full disk cannot make its -shm): the
                # file alone is the whole database, read as it is
                try:
                    with _immutable(self.path) as db:
                        found: list[Row] = db.execute(sql, args).fetchall()
                        return found
                except sqlite3.Error:
                    pass
            raise StateError(f"the usage database {self.path} cannot be read "
                             f"({cause(e, self.state_dir) if not isinstance(e, StateError) else e})"
                             ) from None

    def sums(self, q: Query) -> dict[tuple[tuple[str, ...], str], int]:
        """(group, counter) → total for the question ``q``, the counts in memory added.
        StateError when the file cannot be read."""
        where: list[str] = ["1"]
        args: list[str] = []
        for column, op, bound in (("day", ">=", q.since), ("day", "<=", q.until),
                                  ("key", "=", q.key), ("preset", "=", q.preset)):
            if bound:
                where.append(f"{column} {op} ?")
                args.append(bound)
        cols = "".join(f"{g}, " for g in q.by)
        sql = (f"SELECT {cols}counter, SUM(value) FROM usage WHERE {' AND '.join(where)} "
               f"GROUP BY {cols}counter")
        with self._lock:
            rows = self._read(sql, tuple(args))
            pending = [(c, v) for c, v in self.pending.items() if matches(q, c)]
        out: dict[tuple[tuple[str, ...], str], int] = {}
        n = len(q.by)
        for row in rows:
            found = (tuple(str(x) for x in row[:n]), str(row[n]))
            out[found] = out.get(found, 0) + int(row[n + 1])
        for cell, value in pending:
            kept = (group_of(q, cell), cell[3])
            out[kept] = out.get(kept, 0) + value
        return out

    def key_totals(self, today: date) -> dict[str, tuple[int, int]]:
        """Key name → (tokens today, tokens this month), UTC; tokens = prompt + generated.
        StateError when the file cannot be read."""
        day, month = today.isoformat(), today.replace(day=1).isoformat()
        sql = ("SELECT key, SUM(CASE WHEN day = ? THEN value ELSE 0 END), SUM(value) "
               "FROM usage WHERE day >= ? AND day <= ? AND counter IN "
               "('prompt_tokens', 'generated_tokens') GROUP BY key")
        with self._lock:
            rows = self._read(sql, (day, month, day))
            pending = [(c, v) for c, v in self.pending.items()
                       if month <= c[0] <= day and tokens(c[3])]
        out = {str(k): (int(d), int(m)) for k, d, m in rows}
        for (d, key, _, _), value in pending:
            t, m = out.get(key, (0, 0))
            out[key] = (t + (value if d == day else 0), m + value)
        return out

    def close(self) -> None:
        """A last flush (its fault logged: the counts in memory are then lost, said so),
        and the file closed."""
        if self.pending and not self.flush():
            log.warning("usage: %d counts not written at the daemon's stop (%s): lost",
                        sum(self.pending.values()), self.unwritable)
        with self._lock:
            self._close()


def _size(path: str) -> int:
    try:
        return os.path.getsize(path)
    except OSError:
        return 0


@contextmanager
def _immutable(path: str) -> Iterator[sqlite3.Connection]:
    from urllib.parse import quote

    db = sqlite3.connect(f"file:{quote(path)}?immutable=1", uri=True, check_same_thread=False)
    try:
        yield db
    finally:
        db.close()
