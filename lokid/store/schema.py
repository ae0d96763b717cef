"""The state DB's schema: its migrations, and which releases may still use a file.

Two numbers describe a file:

- its *version*: how many migrations made it (``version`` in the ``schema`` table; a
  file made before that table existed has it in ``PRAGMA user_version``);
- its *level*, in ``PRAGMA user_version``: the oldest schema version a lokid must know
  to read and write the file. Release 0.1.0 refuses a file whose user_version is newer
  than the schema it knows (3), and every release since reads it the same way, so the
  level is what keeps an older lokid working on a newer file.

A migration is *additive* when a lokid that does not know it still reads and writes the
file correctly: a new table, a new column that is nullable or has a default, a new
index, dropping a table no release reads or writes. Additive migrations leave the level
alone: the previous release keeps using the file (an engine still loading across an
upgrade clears its token; a downgrade keeps its tokens and verdicts). Anything else (a
column renamed, retyped or made NOT NULL without a default, a table an older release
uses dropped, a meaning changed) is *breaking*: the level moves to that migration's
version, and an older lokid refuses the file, naming the release to run (the ``needs``
row: the first release that knows the level, written with the ``level`` it is for).

Every write of lokid names its columns, so columns a newer release added keep their
defaults when this one writes a row.
"""

from __future__ import annotations

import sqlite3

from ..core.errors import StateError
from ..core.record import record


@record
class Migration:
    """One step of the schema: ``sql`` (statements separated by ``;``), whether an older
    lokid can no longer use the file after it, and the first release that has it."""

    sql: str
    breaking: bool
    release: str


# Migration n brings the schema from version n to n + 1.
MIGRATIONS = [
    Migration("""
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
    """, breaking=True, release="0.1.0"),
    # 2: benchmark results (lokid.core.bench.rules): the last complete one of each preset,
    # with what it measured. Breaking only because release 0.1.0 refused every newer
    # version (levels came with version 4).
    Migration("""
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
    """, breaking=True, release="0.1.0"),
    # 3: reasoning-effort levels a model's chat template refused, and the one it took.
    Migration("""
    CREATE TABLE effort (
        model   TEXT NOT NULL,
        wanted  TEXT NOT NULL,
        used    TEXT NOT NULL,
        PRIMARY KEY (model, wanted)
    );
    """, breaking=True, release="0.1.0"),
    # 4: the version and level are kept apart (this module's docstring). bench_last (the
    # last result overall) was never read and no release writes it: dropping it is
    # additive, and release 0.1.0 still uses the file.
    Migration("""
    CREATE TABLE schema (
        key    TEXT PRIMARY KEY,
        value  TEXT NOT NULL
    );
    DROP TABLE bench_last
    """, breaking=False, release="0.2.0"),
    # 5: footprints (lokid.core.place.footprint): what each preset's engine held per
    # device, by the key of what changes memory; a new table, additive.
    Migration("""
    CREATE TABLE footprint (
        preset  TEXT NOT NULL,
        key     TEXT NOT NULL,
        record  TEXT NOT NULL,
        at      REAL NOT NULL,
        PRIMARY KEY (preset, key)
    )
    """, breaking=False, release="0.3.0"),
]

KNOWN = len(MIGRATIONS)  # the newest version this lokid knows


def level_of(version: int) -> int:
    """The level of a file at ``version`` (one this lokid knows): the version its last
    breaking migration reached."""
    return max((n + 1 for n, m in enumerate(MIGRATIONS[:version]) if m.breaking), default=0)


@record
class Schema:
    """What a file says of itself: its version, its level, and the release its level
    needs ("" when the file does not say)."""

    version: int
    level: int
    needs: str = ""

    @property
    def usable(self) -> bool:
        """Whether this lokid may read and write the file."""
        return self.level <= KNOWN

    def refusal(self, path: str) -> str:
        """Why this lokid refuses the file (when not :attr:`usable`), naming what to run."""
        from .. import __version__

        run = f"lokid {self.needs} or newer" if self.needs else "a newer lokid"
        return (f"the state database {path} has schema version {self.version}, which only "
                f"{run} can use (this lokid {__version__} knows schema versions up to "
                f"{KNOWN}; an additive change would have kept it usable): upgrade lokid, or "
                "move the file aside to start a new one")


def read(db: sqlite3.Connection) -> Schema:
    """The schema a connection's file says it has (sqlite3.Error when it cannot be read)."""
    level = int(db.execute("PRAGMA user_version").fetchone()[0])
    rows: dict[str, str] = {}
    if db.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'schema'"
                  ).fetchone():
        rows = dict(db.execute("SELECT key, value FROM schema"))
    try:
        version = max(int(rows.get("version", level)), level)
    except ValueError:
        version = level  # an unreadable row: the level is still the refusal's guide
    # "needs" names the release for the level it was written with, not a level set since
    needs = rows.get("needs", "") if rows.get("level") == str(level) else ""
    return Schema(version, level, needs)


def check(path: str, db: sqlite3.Connection) -> Schema:
    """The file's schema, or StateError when this lokid may not use it."""
    found = read(db)
    if not found.usable:
        raise StateError(found.refusal(path))
    return found


def migrate(path: str, db: sqlite3.Connection) -> None:
    """Bring the file up to this lokid's schema, in one transaction; a file at the current
    version or newer (and usable) is not written (a full disk still opens it)."""
    if check(path, db).version >= KNOWN:
        return
    db.execute("BEGIN IMMEDIATE")
    try:
        found = check(path, db)  # again, under the write lock: another process may have
        for n in range(found.version, KNOWN):
            # executescript() would commit the transaction: one statement at a time
            for statement in MIGRATIONS[n].sql.split(";"):
                if statement.strip():
                    db.execute(statement)
        if found.version < KNOWN:
            level = max(found.level, level_of(KNOWN))
            needs = next(m.release for n, m in enumerate(MIGRATIONS) if n + 1 == level)
            db.executemany("INSERT OR REPLACE INTO schema (key, value) VALUES (?, ?)",
                           [("version", str(KNOWN)), ("level", str(level)),
                            ("needs", needs)])
            db.execute(f"PRAGMA user_version = {level}")
        db.execute("COMMIT")
    except BaseException:
        if db.in_transaction:
            db.execute("ROLLBACK")
        raise
