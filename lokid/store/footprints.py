"""Footprints in the state DB (issue 29): what each preset's engine held per device, kept
by the key of what changes memory (:mod:`lokid.core.place.footprint`), at most
:data:`KEPT` per preset (an operator going back and forth between two contexts keeps
both). A mixin of :class:`lokid.store.state.StateDB`; the records' JSON is the core's,
imported only when a footprint is read or written (never on an engine's start path)."""

from __future__ import annotations

import sqlite3
import time

from ..core.errors import StateError

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing on a start's path
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

    from ..core.place.footprint import Footprint

KEPT = 8


class FootprintReader:
    """``footprint``: a record read back (a mixin of the StateDB and of the read-only
    StateReader that ``lokid plan`` uses)."""

    _query: Callable[..., Any]

    def footprint(self, preset: str, key: str) -> Footprint | None:
        """The preset's footprint for ``key``; None when there is none, when it cannot be
        read, or when the record is damaged (it is measured again)."""
        from ..core.place.footprint import from_json

        try:
            row = self._query(lambda db: db.execute(
                "SELECT record FROM footprint WHERE preset = ? AND key = ?",
                (preset, key)).fetchone(), None)
        except StateError:
            return None
        if row is None or not isinstance(row[0], str):
            return None
        found = from_json(row[0])
        return found if found is not None and found.key == key else None


class FootprintStore(FootprintReader):
    """``save_footprint`` over the StateDB's own transactions, and ``footprint``."""

    FOOTPRINTS_KEPT = KEPT
    _write: Callable[..., Any]

    def save_footprint(self, preset: str, record: Footprint) -> None:
        """Keep the preset's footprint for its key (the oldest beyond KEPT go).
        StateError when the database cannot be written."""
        from ..core.place.footprint import to_json

        def do(db: sqlite3.Connection) -> None:
            db.execute("INSERT OR REPLACE INTO footprint (preset, key, record, at) "
                       "VALUES (?, ?, ?, ?)", (preset, record.key, to_json(record), time.time()))
            db.execute("DELETE FROM footprint WHERE preset = ? AND key NOT IN (SELECT key "
                       "FROM footprint WHERE preset = ? ORDER BY at DESC LIMIT ?)",
                       (preset, preset, self.FOOTPRINTS_KEPT))

        self._write(do)
