"""Engine logs for the callers polkit allows: ``Preset.ReadLogs`` and ``Preset.StatsSince``.

Group loki manages the engines, but the system journal is not theirs to read; the
daemon reads it for them (action ``org.lokid.lokid1.read-logs``, allowed to group loki
by the shipped rules). The rules a read keeps:

- the journal of the preset's unit only, as ``journalctl -u`` shows it, and never more
  than :data:`lokid.watch.journalread.MAX_LINES` entries or its byte bound per call;
- following is polling, not a long call: a reader passes the cursor it was given and
  gets what came after (a call never waits for lines, so no call holds the daemon);
- under the local runner (no journal) the lines come from what the runner keeps of its
  children's output (:mod:`lokid.core.telemetry.logring`), with the same cursor protocol;
  ``StatsSince`` needs the journal, and says so;
- the lines are the engine's, as the journal has them: no more than a member could
  see with the journal's own rights; the action is not anyone's.

Reading runs in a worker thread with a reader of its own per call.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable
from typing import Any, TypeVar

from ..core.errors import EngineError, InvalidArgsError
from ..core.names import engine_unit

MAX_COUNT = 10000
T = TypeVar("T")


def system_reader() -> Any:
    from systemd import journal

    return journal.Reader(flags=journal.SYSTEM_ONLY)


class Logs:
    def __init__(self, runner: Callable[[], Any],
                 open_reader: Callable[[], Any] = system_reader):
        self.runner = runner        # the daemon's runner now (None before it has one)
        self.open_reader = open_reader

    def _local(self) -> Any:
        """The local runner's rings (preset → LogRing), or None under systemd."""
        runner = self.runner()
        return getattr(runner, "logs", None) if getattr(runner, "kind", "") == "local" \
            else None

    async def read(self, preset: str, cursor: str, count: int
                   ) -> tuple[list[tuple[int, str, str]], str]:
        if not 0 < count <= MAX_COUNT:
            raise InvalidArgsError(f"lines: 1 to {MAX_COUNT}")
        rings = self._local()
        if rings is not None:
            ring = rings.get(preset)
            return ring.read(cursor, count) if ring is not None else ([], cursor)
        if cursor.startswith("local:"):
            cursor = ""  # a cursor of a local runner's: this daemon reads the journal now
        from ..watch.journalread import read_unit

        def read() -> tuple[list[tuple[int, str, str]], str]:
            reader = self.open_reader()
            try:
                return read_unit(reader, engine_unit(preset), cursor, count)
            finally:
                reader.close()

        return await _journal(read)

    async def window(self, preset: str, since: float, kind: str) -> dict[str, Any]:
        if not math.isfinite(since):
            raise InvalidArgsError("since: a time in seconds since the epoch")
        if self._local() is not None:
            raise InvalidArgsError("StatsSince reads the engine's journal, and engines run "
                                   "as the daemon's children here (no journal): its Stats "
                                   "show the current start")
        from ..watch.journalread import window

        def count() -> dict[str, Any]:
            reader = self.open_reader()
            try:
                return window(reader, engine_unit(preset), since, kind)
            finally:
                reader.close()

        return await _journal(count)


async def _journal(read: Callable[[], T]) -> T:
    """``read`` in a worker thread; the journal's own failure as lokid's error."""
    try:
        return await asyncio.to_thread(read)
    except OSError as e:
        raise EngineError(f"cannot read the journal: {e.strerror or e}") from None
