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
schema grows by migrations, and says which older releases may still use the file
(:mod:`lokid.store.schema`); the note a token leaves where the database cannot clear it
is :mod:`lokid.store.cleared`.

Faults of the database never stop a start, and take the safe side:
- A damaged file (SQLite's "database disk image is malformed" or "file is not
  a database", on opening or on any query) is moved aside by :class:`StateDB`
  as ``state.db.damaged-<UTC time>`` with its -wal and -shm, said in one
  warning, and a new empty database replaces it: the tokens, verdicts and
  benchmark results it held are lost, and the next automatic launch of each
  configuration is tried once more, under a new token. :class:`StateReader`
  never moves anything: it reads a damaged file as empty and says so.
- A database that cannot be written (a full disk, a read-only file system)
  opens read-only: ``unwritable`` says why, :meth:`StateDB.peek` cuts
  automatic speculation (a launch that cannot leave its token must not try)
  and every write raises :class:`~lokid.core.errors.StateError`. On a full
  disk SQLite cannot even make the -shm file of a WAL database; a database
  whose WAL holds nothing is then read from its file alone.
- A token whose launch answered, or was stopped while loading, but that the
  database could not clear then (the disk filled while the engine loaded) is
  noted in the runtime directory instead (:func:`note_cleared`: a tmpfs,
  another file system). Peek, given that note, counts the token as cleared,
  and the next settle that succeeds forgets the note. A token is told apart
  from a later one of the same mark by when it was set, so a note that
  outlived its token never excuses another launch.

Every public method says what a fault gives its caller: a
:class:`~lokid.core.errors.StateError` (whose message names the file and the
cause), or a safe default. No ``sqlite3`` exception leaves this module.
"""

from __future__ import annotations

import errno
import json
import os
import sqlite3
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from ..core.errors import StateError
from ..core.launch.attempt import NEVER_ANSWERED, Mark, Verdict, verdict
from ..core.record import record
from ..host.journallog import journal_log
from . import schema
from .cleared import Token, forget_cleared, note_cleared, read_cleared
from .footprints import FootprintReader, FootprintStore
from .sqlfile import (
    BUSY_TIMEOUT_MS,
    DAMAGED_SUFFIX,
    DB_FILE,
    cause,
    create_for_dir_owner,
    dir_lock,
    file_system_fault,
    inode_of,
    is_damaged,
    open_ro,
    use_wal,
)

__all__ = ["NEVER_ANSWERED", "Mark", "Verdict", "verdict", "StateDB", "StateReader", "Failure",
           "SavedBench", "Token", "note_cleared", "read_cleared", "forget_cleared",
           "needs_token"]

FAILED_MAX = 32          # failed marks kept per preset, oldest forgotten first

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing on a start's path
if TYPE_CHECKING:
    from typing import TypeVar

    T = TypeVar("T")

@record
class SavedBench:
    """A complete benchmark result as saved: what it measured, and when."""

    preset: str
    result: dict[str, object]
    model: str
    engine: str
    fingerprint: str
    at: float


@record
class Failure:
    mark: str
    reason: str
    at: float


def needs_token(why: str) -> str:
    """The verdict when no token can be set (``why``: the state DB cannot be written)."""
    return f"{why}, and automatic speculation needs its attempt token"


def _read(db: sqlite3.Connection, preset: str) -> tuple[Token | None, dict[str, str]]:
    """The preset's attempt token and its marks recorded as failed."""
    row = db.execute("SELECT mark, since FROM attempt WHERE preset = ?", (preset,)).fetchone()
    failed = dict(db.execute("SELECT mark, reason FROM failed WHERE preset = ?", (preset,)))
    return (Token(row[0], row[1]) if row else None), failed


class _Store:
    """What :class:`StateReader` and :class:`StateDB` share: the reads and the verdict.

    ``problem``: why reads see nothing (the database is damaged and was not replaced, or
    cannot be read), "" when they see the database. ``unwritable``: why the next start
    cannot set a token here, "" when it can.
    """

    # Whether peek, when the database cannot be read, cuts automatic speculation (the
    # writer's peek is a start's: it is about to need the database) or only says so.
    _BLIND_CUTS = False

    def __init__(self, state_dir: str):
        self.state_dir = state_dir
        self.path = os.path.join(state_dir, DB_FILE)
        self._db: sqlite3.Connection | None = None
        self.problem = ""
        self.unwritable = ""

    def close(self) -> None:
        if self._db is not None:
            self._db.close()
            self._db = None

    def _fault(self, e: BaseException, what: str) -> StateError:
        return StateError(f"the state database {self.path} cannot be {what} "
                          f"({cause(e, self.state_dir)})")

    def _damage(self, e: BaseException) -> bool:
        """A damaged database met by a query: True when it was replaced (the query runs
        again); here it is read as empty from now on."""
        self.close()
        self.problem = (f"the state database {self.path} is damaged ({e}): read as empty; "
                        "the next start moves it aside and starts a new one")
        return False

    def _query(self, fn: Callable[[sqlite3.Connection], T], empty: T) -> T:
        """``fn`` on the database; ``empty`` when there is none, or a damaged one that
        stays (read as empty). A damaged one that was replaced is asked again. StateError
        for any other fault."""
        for retry in (False, True):
            if self._db is None:
                return empty
            try:
                return fn(self._db)
            except sqlite3.Error as e:
                if retry or not is_damaged(e):
                    raise self._fault(e, "read") from None
                if not self._damage(e):
                    return empty
        return empty  # unreachable: the second round returns or raises

    # --- the attempt token ---------------------------------------------------------

    def peek(self, preset: str, mark: Mark, loading: bool = False,
             cleared: Token | None = None) -> Verdict:
        """Read-only verdict for the next launch of ``mark``; never raises.

        ``cleared``: the token noted by :func:`read_cleared`, which counts as cleared
        when it is the one on record. A database that cannot be written cuts automatic
        speculation (:func:`needs_token`) unless a verdict on record already does.
        """
        nothing: tuple[Token | None, dict[str, str]] = (None, {})
        try:
            token, failed = self._query(lambda db: _read(db, preset), nothing)
        except StateError as e:
            unknown = f"{e}: whether the last automatic launch of this configuration failed " \
                      "is unknown"
            return Verdict(unknown) if self._BLIND_CUTS else Verdict(pending=unknown)
        if token is not None and token == cleared:
            token = None
        found = verdict(mark.key(), None if token is None else token.mark, failed, loading)
        if self.unwritable:
            # a failure on record is the truer reason; one due cannot be recorded now (the
            # token stays, and the next start that can write records it)
            return Verdict(found.why) if found.why else Verdict(needs_token(self.unwritable))
        if self.problem and not found.why and not found.pending:
            return Verdict(pending=self.problem)
        return found

    def token(self, preset: str) -> Token | None:
        """The preset's attempt token; None when there is none or it cannot be read."""
        try:
            return self._query(lambda db: _read(db, preset)[0], None)
        except StateError:
            return None

    def effort(self, model: str, wanted: str) -> str | None:
        """The level to send for ``wanted`` with ``model`` ("" = no field), if one was
        learned; None too when it cannot be read (it is learned again)."""
        try:
            row = self._query(lambda db: db.execute(
                "SELECT used FROM effort WHERE model = ? AND wanted = ?",
                (model, wanted)).fetchone(), None)
        except StateError:
            return None
        return None if row is None else str(row[0])


class StateReader(_Store, FootprintReader):
    """A look at the state database that never creates, migrates, moves or writes it.

    ``lokid plan`` uses it: it shows what the next start runs without changing
    anything, and may run as a user who can read the database but not write it.
    A database that does not exist yet holds no verdict.

    Never raises: a database it cannot read (damaged, unreadable for this user) is read
    as empty, ``problem`` says why and :meth:`peek` adds that as a note; one of a newer
    schema sets ``unwritable``, since the next start cannot use it either.
    """

    def __init__(self, state_dir: str):
        super().__init__(state_dir)
        try:
            self._db = open_ro(self.path)
        except StateError as e:
            self.unwritable = str(e)
        except (OSError, sqlite3.Error) as e:
            if is_damaged(e):
                self._damage(e)
            else:
                self.problem = f"the state database {self.path} cannot be read " \
                               f"({cause(e, state_dir)}): whether the last automatic " \
                               "launch of this configuration failed is unknown"
        # What the next start will meet writing: a read-only file system refuses for
        # sure; a full one most likely (a WAL with room left may still take a token).
        fault = file_system_fault(state_dir) if os.path.isdir(state_dir) else ""
        if fault == os.strerror(errno.EROFS) and not self.unwritable:
            self.unwritable = f"the state database {self.path} cannot be written ({fault})"
        elif fault and not self.unwritable and not self.problem:
            self.problem = (f"the state database {self.path} is on a file system that says "
                            f"\"{fault}\": the next start may be unable to set its attempt "
                            "token, and would then run without automatic speculation")

    def __enter__(self) -> StateReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class StateDB(_Store, FootprintStore):
    """The state database of one ``$LOKI_STATE_DIR``, for the processes that write it.

    Opening raises StateError only when there is nothing to work with: the directory
    cannot be made, the database cannot even be read, or its schema needs a newer lokid
    (:mod:`lokid.store.schema`: additive changes of a newer release do not). A damaged
    database is moved aside and replaced (one warning); one that cannot be written
    opens read-only (``unwritable``). Each method says what a fault gives its caller.
    """

    _BLIND_CUTS = True

    def __init__(self, state_dir: str):
        super().__init__(state_dir)
        self._ino: int | None = None    # the file this connection opened (see _set_aside)
        try:
            os.makedirs(state_dir, exist_ok=True)
        except OSError as e:
            raise StateError(f"the state database {self.path} cannot be created: "
                             f"{state_dir}: {e.strerror}") from None
        try:
            self._open()
        except BaseException:
            self.close()
            raise

    def __enter__(self) -> StateDB:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- opening ---------------------------------------------------------------------

    def _open(self, damaged: BaseException | None = None) -> None:
        """Open read-write; a damaged file (``damaged``: found by a query) is moved aside,
        once, and a new database made in its place; one that cannot be written opens
        read-only (``unwritable`` says why)."""
        moved = False
        while True:
            if damaged is not None:
                # Moved while its connection is still open: closing the last connection
                # of a file deletes the -wal and -shm of that name, which must go aside
                # with it (and must not be the new database's).
                ok = not moved and self._set_aside(damaged)
                self.close()  # _set_aside closed it, unless it did not run
                if not ok:
                    error: BaseException = damaged
                    break
                moved, damaged = True, None
            try:
                self._open_rw()
                return
            except sqlite3.Error as e:
                if is_damaged(e):
                    damaged = e
                    continue
                error = e
            except OSError as e:
                error = e
            self.close()
            break
        if not self.unwritable:
            self.unwritable = f"the state database {self.path} cannot be written " \
                              f"({cause(error, self.state_dir)})"
        try:
            self._db = open_ro(self.path)
        except (OSError, sqlite3.Error) as e:
            if not is_damaged(e):
                raise StateError(f"the state database {self.path} cannot be opened "
                                 f"({cause(e, self.state_dir)})") from None
            _Store._damage(self, e)

    def _open_rw(self) -> None:
        """``self._db``, read-write and migrated; on an error it stays open for the caller
        (see :meth:`_open`). Under the directory's shared lock: never while another
        process moves a damaged file aside (:meth:`_set_aside`)."""
        with dir_lock(self.state_dir, exclusive=False):
            if os.geteuid() == 0:
                create_for_dir_owner(self.path, self.state_dir)
            self._ino = inode_of(self.path)
            self._db = db = sqlite3.connect(self.path, timeout=BUSY_TIMEOUT_MS / 1000,
                                            isolation_level=None)
            db.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
            use_wal(db)
            db.execute("PRAGMA synchronous = NORMAL")
            self._migrate(db)

    def _migrate(self, db: sqlite3.Connection) -> None:
        """Bring the schema up to date (:mod:`lokid.store.schema`); a current one, or a
        newer one this lokid may use, is not written (a full disk still opens it)."""
        schema.migrate(self.path, db)

    def _set_aside(self, e: BaseException) -> bool:
        """Move the damaged database (with its -wal and -shm) to ``state.db.damaged-<UTC
        time>``, and close this connection to it; whether a new one may be made in its
        place.

        Under the directory's exclusive lock (no process is opening the database
        meanwhile: see :meth:`_open_rw`), and only when the file there is still the one
        this connection opened: two helpers finding the same damage at once (two presets
        starting at boot) set it aside once, and the second opens the first one's new
        database rather than moving it away too. The connection is closed before the
        lock is released: SQLite removes the -wal and -shm of the name it opened, which
        must have gone aside by then, and must not yet be the new database's.
        """
        try:
            with dir_lock(self.state_dir, exclusive=True):
                try:
                    if inode_of(self.path) != self._ino:
                        return True  # set aside already, by another process
                    aside = self._aside_name()
                    os.rename(self.path, aside)
                    for suffix in ("-wal", "-shm"):
                        try:
                            os.rename(self.path + suffix, aside + suffix)
                        except FileNotFoundError:
                            pass
                finally:
                    self.close()
        except OSError as oe:
            self.unwritable = f"the state database {self.path} is damaged ({e}) and " \
                              f"cannot be moved aside ({oe.strerror})"
            return False
        journal_log("", f"the state database {self.path} is damaged ({e}): moved aside to "
                    f"{aside}, and a new one started (the attempt tokens, failure verdicts "
                    "and benchmark results it held are lost)", priority=4)
        return True

    def _aside_name(self) -> str:
        aside = self.path + DAMAGED_SUFFIX + time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
        n = 1
        while os.path.lexists(aside + (f".{n}" if n > 1 else "")):
            n += 1
        return aside + (f".{n}" if n > 1 else "")

    def _damage(self, e: BaseException) -> bool:
        if self.unwritable:
            return super()._damage(e)  # cannot move it: read as empty
        self._open(damaged=e)
        return not self.unwritable

    # --- writing ---------------------------------------------------------------------

    @contextmanager
    def _transaction(self) -> Iterator[sqlite3.Connection]:
        if self._db is None:
            raise StateError(self.unwritable or f"the state database {self.path} is closed")
        db = self._db
        db.execute("BEGIN IMMEDIATE")
        try:
            yield db
            db.execute("COMMIT")
        except BaseException:
            if db.in_transaction:  # a failed COMMIT may have rolled back already
                try:
                    db.execute("ROLLBACK")
                except sqlite3.Error:
                    pass
            raise

    def _write(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        """``fn`` in one write transaction (taken before reading, so its reads are under
        the lock); StateError when the database cannot be written. A damaged database
        is replaced and ``fn`` runs on the new one."""
        if self.unwritable:
            raise StateError(self.unwritable)
        for retry in (False, True):
            try:
                with self._transaction() as db:
                    return fn(db)
            except sqlite3.Error as e:
                if retry or not is_damaged(e) or not self._damage(e):
                    raise self._fault(e, "written") from None
        raise AssertionError("unreachable: the second round returns or raises")

    @property
    def schema_version(self) -> int:
        """StateError when it cannot be read; 0 for a database that could not be made."""
        return self._query(lambda db: schema.read(db).version, 0)

    def _record(self, db: sqlite3.Connection, preset: str, mark: str, why: str) -> None:
        db.execute("INSERT OR REPLACE INTO failed (preset, mark, reason, at) VALUES (?, ?, ?, ?)",
                   (preset, mark, why, time.time()))
        db.execute("""DELETE FROM failed WHERE preset = ? AND mark NOT IN (
                          SELECT mark FROM failed WHERE preset = ?
                          ORDER BY at DESC, rowid DESC LIMIT ?)""",
                   (preset, preset, FAILED_MAX))

    # --- the attempt token ---------------------------------------------------------

    def settle(self, preset: str, mark: Mark, found: Verdict, attempt: bool) -> Token | None:
        """Once the port is free, just before launching: consume the old token, record
        the failure ``found`` by :meth:`peek` if due, set a token if ``attempt``.

        Returns the new token. StateError when the database cannot be written: nothing
        changed, and a launch that wanted a token must run without automatic flags.
        """
        token = Token(mark.key(), time.time()) if attempt else None

        def do(db: sqlite3.Connection) -> None:
            db.execute("DELETE FROM attempt WHERE preset = ?", (preset,))
            if found.record:
                self._record(db, preset, mark.key(), found.why)
            if token is not None:
                db.execute("INSERT INTO attempt (preset, mark, since) VALUES (?, ?, ?)",
                           (preset, token.mark, token.since))

        self._write(do)
        return token

    def clear(self, preset: str, mark: Mark, why: str = "") -> bool:
        """Remove ``mark``'s token, and only it; with ``why``, record ``mark`` as failed.

        Returns whether the token was there. StateError when the database cannot be
        written (the caller may :func:`note_cleared` the token instead).
        """
        def do(db: sqlite3.Connection) -> bool:
            current, _ = _read(db, preset)
            if current is None or current.mark != mark.key():
                return False
            db.execute("DELETE FROM attempt WHERE preset = ?", (preset,))
            if why:
                self._record(db, preset, mark.key(), why)
            return True

        return self._write(do)

    def record_failure(self, preset: str, mark: Mark, why: str) -> None:
        """Record ``mark`` as failed whatever the token (a verdict from the journal).
        StateError when the database cannot be written."""
        self._write(lambda db: self._record(db, preset, mark.key(), why))

    def attempt(self, preset: str) -> str | None:
        """The mark of the preset's token; StateError when it cannot be read."""
        token = self._query(lambda db: _read(db, preset)[0], None)
        return None if token is None else token.mark

    def failures(self, preset: str) -> list[Failure]:
        """The failed marks on record, oldest first; StateError when they cannot be read."""
        def do(db: sqlite3.Connection) -> list[Failure]:
            rows = db.execute("SELECT mark, reason, at FROM failed WHERE preset = ? "
                              "ORDER BY at, rowid", (preset,))
            return [Failure(m, r, a) for m, r, a in rows]

        return self._query(do, [])

    def clear_failures(self, preset: str) -> int:
        """Forget them; how many there were. StateError when that cannot be written."""
        return self._write(
            lambda db: db.execute("DELETE FROM failed WHERE preset = ?", (preset,)).rowcount)

    # --- a preset deleted or renamed ---------------------------------------------------

    _PER_PRESET = ("attempt", "failed", "bench", "footprint")  # the tables keyed by preset

    def forget_preset(self, preset: str) -> int:
        """A deleted preset: its attempt token, recorded failures and bench result go (a
        new preset of that name starts clean); how many rows. StateError when that cannot
        be written."""
        def do(db: sqlite3.Connection) -> int:
            return sum(db.execute(f"DELETE FROM {table} WHERE preset = ?", (preset,)).rowcount
                       for table in self._PER_PRESET)

        return self._write(do)

    def move_preset(self, old: str, new: str) -> int:
        """A renamed preset keeps its records under its new name (whatever an older preset
        of that name left goes first); how many rows moved."""
        def do(db: sqlite3.Connection) -> int:
            moved = 0
            for table in self._PER_PRESET:
                db.execute(f"DELETE FROM {table} WHERE preset = ?", (new,))
                moved += db.execute(f"UPDATE {table} SET preset = ? WHERE preset = ?",
                                    (new, old)).rowcount
            return moved

        return self._write(do)

    # --- benchmark results -----------------------------------------------------------

    def save_bench(self, saved: SavedBench) -> None:
        """Keep a complete result as the preset's (replacing its previous one).
        StateError when the database cannot be written."""
        blob = json.dumps(saved.result, sort_keys=True)
        self._write(lambda db: db.execute(
            "INSERT OR REPLACE INTO bench (preset, result, model, engine, fingerprint, at) "
            "VALUES (?, ?, ?, ?, ?, ?)",
            (saved.preset, blob, saved.model, saved.engine, saved.fingerprint, saved.at)))

    def bench(self, preset: str, fingerprint: str | None = None) -> SavedBench | None:
        """The preset's saved result; with ``fingerprint``, only if it measured that
        configuration (a preset whose model, GPUs or arguments changed shows nothing).
        None too when it cannot be read (nothing to show is the safe answer)."""
        try:
            row = self._query(lambda db: db.execute(
                "SELECT result, model, engine, fingerprint, at FROM bench WHERE preset = ?",
                (preset,)).fetchone(), None)
        except StateError:
            return None
        if row is None or (fingerprint is not None and row[3] != fingerprint):
            return None
        try:
            result = json.loads(row[0])
        except ValueError:
            return None
        return SavedBench(preset, result, row[1], row[2], row[3], row[4])

    def learn_effort(self, model: str, wanted: str, used: str) -> None:
        """StateError when the database cannot be written."""
        self._write(lambda db: db.execute(
            "INSERT OR REPLACE INTO effort (model, wanted, used) VALUES (?, ?, ?)",
            (model, wanted, used)))
