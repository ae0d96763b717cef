"""Per-preset telemetry in the daemon: the engine lines it already reads, counted.

Under systemd the lines come from the journal the daemon follows for its
verdicts (:mod:`lokid.watch.journalwatch`); under the local runner, from the
engine's pipe. Either way they reach :meth:`Meters.feed` with the preset, the
start (invocation) and the time of the line. Each start gets its own
:class:`~lokid.core.telemetry.requestlog.EngineLog` (what the lines say) and
:class:`~lokid.core.telemetry.figures.StartStats` (the windows and totals); a new start
of a preset replaces the old one's figures. The kind of speculation a draft
line counts for comes from the start's runtime plan.

The journal is the history: nothing here is stored. ``lokictl stats --since``
reads the journal itself with the same parser.

A start whose engine finished requests of which the parser read none is flagged
(:attr:`Meters.blind`), as the journal watcher flags a load without any line it
knows: the engine's log format has probably changed. Finished, not only taken
(``processing task``): an engine started by a swap takes the clients that queued for
it all at once, one per slot, and their timing lines come at their ends. Counting
launches flagged 66 to 112 starts of a 3-minute team load (issue 28, item 17) whose
every timing line was in the journal. A request has ended when its slot released
it, was given another task, or the engine said all slots are idle; a launch line the
parser cannot read is never in flight, so it counts as ended at once (what a changed
format looks like).

A request that ended without printing a timing line at all is not counted
(:attr:`lokid.core.telemetry.requestlog.EngineLog.untimed`): embeddings and rerank print none, and
three of them made the warning say "its Stats are blind" of an engine whose log is read
(issue 48, item 4). A completion whose timing lines lokid cannot parse is still counted.

Lines lokid never read (journald said "Suppressed N messages from loki-engine@P.service",
issue 45, item 9: 33 % of a team load's requests went uncounted while Stats looked
whole) reach :meth:`Meters.gap`: the start's snapshot then says ``missed_lines`` (the
lines journald dropped), ``requests_lower_bound`` (its counts are at least, not exactly)
and, until every slot has been seen again, ``in_flight_known`` false, which holds the
idle stop (:mod:`lokid.dbus.idle`): lost lines are never taken for idleness.

Changes are announced at most once a second per preset (the caller polls
:meth:`Meters.take_dirty`), however many requests an engine serves.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..core.errors import StalePlanError
from ..core.telemetry.figures import StartStats
from ..core.telemetry.requestlog import EngineLog
from ..store.runtimedir import read_runtime_plan


def draft_kind(spec_types: tuple[str, ...] | list[str]) -> str:
    """What a draft line counts for, from the start's speculation types (``draft-mtp``,
    ``draft-simple``, ``ngram-mod``): "mtp", "draft", "ngram", or several joined by
    "+" (the engine prints one acceptance line for them together)."""
    kinds = ["mtp" if t == "draft-mtp" else "ngram" if t.startswith("ngram") else "draft"
             for t in spec_types]
    return "+".join(dict.fromkeys(kinds))


# After this many requests ended without one record read, the log format has changed.
BLIND_AFTER = 3


@dataclass
class _Start:
    invocation: str
    started: float
    log: EngineLog = field(default_factory=EngineLog)
    stats: StartStats | None = None
    launched: int = 0       # "processing task" lines: requests the engine took
    records: int = 0        # requests the parser read whole
    blind: bool = False     # flagged: requests ended, none read
    counted_from: float | None = None   # a replay left a gap: totals count from here
    # the time of the line that left no request in flight (the end of the last request):
    # where the idle stop's clock restarts (lokid.dbus.idle)
    idle_since: float | None = None
    missed: int = 0         # engine lines journald said it dropped (0: none said)
    gaps: int = 0           # how many times it said so


class Meters:
    def __init__(self, runtime_dir: str):
        self.runtime_dir = runtime_dir
        self.starts: dict[str, _Start] = {}      # preset → its current (or last) start
        self.dirty: set[str] = set()
        # presets whose engine served requests of which no figure could be read (the
        # engine's log format changed?): the caller warns, once per start
        self.blind: list[str] = []
        # told the preset whose count of requests in flight moved (RequestsInFlight on the
        # bus, at once: a swap in a GPU group waits for it, lokid.dbus.idle)
        self.on_in_flight: Callable[[str], None] | None = None

    def feed(self, preset: str, invocation: str, line: str, at: float | None = None) -> None:
        """One engine line of ``preset``'s start ``invocation`` (``at``: its time)."""
        at = time.time() if at is None else at
        start = self.starts.get(preset)
        if start is None or start.invocation != invocation:
            start = self.starts[preset] = _Start(invocation, at)
        if start.stats is None:
            start.stats = StartStats(start.started, self._kind(preset, invocation))
        before = len(start.log.in_flight)
        request = start.log.feed(line, at)
        if before and not start.log.in_flight:
            start.idle_since = at
        if before != len(start.log.in_flight) and self.on_in_flight is not None:
            self.on_in_flight(preset)
        if request is not None:
            start.stats.add(request)
            start.records += 1
        elif "processing task" in line:
            start.launched += 1
        ended = start.launched - len(start.log.in_flight) - start.log.untimed
        if ended >= BLIND_AFTER and not start.records and not start.blind:
            start.blind = True   # that many ended (launched, no longer in flight), none read
            self.blind.append(preset)
        self.dirty.add(preset)

    def gap(self, preset: str, invocation: str, dropped: int, at: float | None = None) -> None:
        """``dropped`` lines of ``preset``'s start ``invocation`` ("": its current one) were
        lost before lokid read them: its counts become a lower bound, and its requests in
        flight unknown until every slot is seen again."""
        at = time.time() if at is None else at
        start = self.starts.get(preset)
        if start is None or (invocation and start.invocation != invocation):
            if not invocation:
                return   # no start of it known: nothing counted, nothing to correct
            start = self.starts[preset] = _Start(invocation, at)
            start.stats = StartStats(at, self._kind(preset, invocation))
        start.missed += max(0, dropped)
        start.gaps += 1
        start.log.gap()
        self.dirty.add(preset)
        if self.on_in_flight is not None:
            self.on_in_flight(preset)

    def _kind(self, preset: str, invocation: str) -> str:
        try:
            rp = read_runtime_plan(self.runtime_dir, preset, invocation or None)
        except (StalePlanError, OSError, ValueError):
            return ""
        return draft_kind(rp.spec_types)

    def adopt(self, preset: str, other: Meters, counted_from: float | None) -> bool:
        """Take ``other``'s figures of ``preset`` (a replay of the journal, made apart) as
        this start's, unless a newer start of it was seen here meanwhile; whether taken."""
        theirs = other.starts.get(preset)
        mine = self.starts.get(preset)
        if theirs is None or (mine is not None and mine.invocation != theirs.invocation):
            return False
        theirs.counted_from = counted_from
        if mine is not None and mine.gaps:   # said live while the replay ran: keep it
            theirs.missed += mine.missed
            theirs.gaps += mine.gaps
            theirs.log.gap()
        self.starts[preset] = theirs
        self.dirty.add(preset)
        return True

    def take_dirty(self) -> set[str]:
        """The presets whose figures changed since the last call."""
        dirty, self.dirty = self.dirty, set()
        return dirty

    def forget(self, preset: str) -> None:
        self.starts.pop(preset, None)
        self.dirty.discard(preset)

    def snapshot(self, preset: str, now: float | None = None) -> dict[str, Any]:
        """The preset's figures for its current start (``{}`` before any line of one)."""
        start = self.starts.get(preset)
        if start is None or start.stats is None:
            return {}
        now = time.time() if now is None else now
        out = start.stats.snapshot(now, start.log.load, len(start.log.in_flight))
        if start.counted_from is not None:
            out["counted_from"] = start.counted_from
        if start.gaps:
            out.update(missed_lines=start.missed, requests_lower_bound=True)
        if not start.log.in_flight_known:
            out["in_flight_known"] = False
        out.update(invocation=start.invocation, started=start.started,
                   uptime_seconds=max(0.0, now - start.started),
                   memory_source="engine log (-lv 4)" if start.log.load.buffers else None)
        return out
