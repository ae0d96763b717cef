"""The state DB's file: opening it (read-only where it cannot be written), and SQLite's
faults told apart in the operator's words.

:mod:`lokid.store.state` reads and writes through these; nothing here knows a table
(the schema is :mod:`lokid.store.schema`). No sqlite3 exception is turned into an
error here: the callers decide what a fault gives theirs.
"""

from __future__ import annotations

import errno
import fcntl
import os
import sqlite3
import time
from collections.abc import Iterator
from contextlib import contextmanager

from . import schema

DB_FILE = "state.db"
DAMAGED_SUFFIX = ".damaged-"  # state.db.damaged-<UTC time>: a damaged database set aside
BUSY_TIMEOUT_MS = 10_000

# SQLite's primary result codes (the low byte of sqlite_errorcode) this module tells apart.
SQLITE_READONLY, SQLITE_IOERR, SQLITE_CORRUPT = 8, 10, 11
SQLITE_FULL, SQLITE_CANTOPEN, SQLITE_NOTADB = 13, 14, 26
DAMAGE = {SQLITE_CORRUPT, SQLITE_NOTADB}
FILE_SYSTEM = {SQLITE_READONLY, SQLITE_IOERR, SQLITE_FULL, SQLITE_CANTOPEN}


def error_code(e: BaseException) -> int | None:
    code = getattr(e, "sqlite_errorcode", None)
    return code & 0xFF if isinstance(code, int) else None


def is_damaged(e: BaseException) -> bool:
    """Whether SQLite found the file damaged (or no database at all)."""
    return error_code(e) in DAMAGE


def file_system_fault(path: str) -> str:
    """The file system's own reason it refuses writes under ``path``: read-only, or no
    block left for this user; "" when it has none."""
    try:
        st = os.statvfs(path)
    except OSError:
        return ""
    if st.f_flag & os.ST_RDONLY:
        return os.strerror(errno.EROFS)
    if (st.f_bfree if os.geteuid() == 0 else st.f_bavail) == 0:
        return os.strerror(errno.ENOSPC)
    return ""


def cause(e: BaseException, state_dir: str) -> str:
    """Why an operation failed, in the operator's words.

    SQLite reports a full disk under a WAL database as "disk I/O error" (its -shm file
    cannot grow) and a read-only file system as "unable to open database file": where
    the file system has a reason of its own, that is the one given.
    """
    if isinstance(e, OSError) or error_code(e) in FILE_SYSTEM:
        fault = file_system_fault(state_dir)
        if fault:
            return fault
    if isinstance(e, OSError) and e.strerror:
        return e.strerror
    return str(e)


def inode_of(path: str) -> int | None:
    try:
        return os.stat(path).st_ino
    except OSError:
        return None


@contextmanager
def dir_lock(state_dir: str, exclusive: bool) -> Iterator[None]:
    """A lock on the state directory: shared while a process opens (and may create) the
    database, exclusive while one moves a damaged database aside.

    Without it a helper starting a moment later made the new database, and its -wal, in
    the instant between the mover's renames of state.db and of state.db-wal: the mover
    then carried the newcomer's live WAL aside with the damaged file, and the token the
    newcomer wrote there was lost. Best effort: a directory that cannot be opened for
    reading is not locked.
    """
    try:
        fd = os.open(state_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        yield
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
        yield
    finally:
        os.close(fd)  # releases the lock


def create_for_dir_owner(path: str, state_dir: str) -> None:
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


def open_ro(path: str) -> sqlite3.Connection | None:
    """``path`` opened read-only; None when it holds no database yet (missing, or empty).

    Raises sqlite3.Error (a damaged file among them) or StateError (a newer schema).
    A WAL database needs its -shm file even to be read; where that cannot be made (a
    read-only or full file system) and the WAL holds nothing, the file alone is the
    whole database and is opened as immutable.
    """
    from urllib.parse import quote

    if not os.path.exists(path):
        return None
    uri = f"file:{quote(path)}"
    try:
        db, version = connect_ro(f"{uri}?mode=ro")
    except sqlite3.Error as e:
        try:
            wal = os.path.getsize(path + "-wal")
        except OSError:
            wal = 0
        if is_damaged(e) or error_code(e) not in FILE_SYSTEM or wal > 0:
            raise
        db, version = connect_ro(f"{uri}?immutable=1")
    if version == 0:  # created and never migrated (the disk filled at once): empty
        db.close()
        return None
    try:
        schema.check(path, db)
    except BaseException:
        db.close()
        raise
    return db


def connect_ro(uri: str) -> tuple[sqlite3.Connection, int]:
    """A read-only connection and the file's ``user_version`` (its schema's level, see
    :mod:`lokid.store.schema`; 0 for a file never migrated), the first read, where SQLite
    finds out whether it can open the file at all."""
    db = sqlite3.connect(uri, uri=True, timeout=BUSY_TIMEOUT_MS / 1000, isolation_level=None)
    try:
        return db, int(db.execute("PRAGMA user_version").fetchone()[0])
    except BaseException:
        db.close()
        raise


def use_wal(db: sqlite3.Connection) -> None:
    """Switch to WAL (persistent: only the first opener of a new file changes it).

    Changing the journal mode needs the database to itself, and SQLite does not
    wait on its busy handler for that: two helpers opening a new state DB at
    once (two presets starting at boot) got "database is locked". Retried here
    within the busy timeout.
    """
    deadline = time.monotonic() + BUSY_TIMEOUT_MS / 1000
    while True:
        try:
            db.execute("PRAGMA journal_mode = WAL")
            return
        except sqlite3.OperationalError as e:
            if "locked" not in str(e) or time.monotonic() > deadline:
                raise
            time.sleep(0.01)
