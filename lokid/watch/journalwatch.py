"""Following the engines' journal: events per invocation, and the layers-in-RAM verdict.

A reusable component (the daemon runs it; ``lokid watch`` runs it alone). It
reads the journal of every ``loki-engine@*.service`` (matched by their
common slice, ``system-loki\\x2dengine.slice``), tracks each start by
``_SYSTEMD_INVOCATION_ID`` and feeds its lines to :mod:`lokid.core.telemetry.enginelog`.
When an invocation becomes ready (the supervisor's "ready at" entry) its load
is judged: if automatic speculation was on and the model or its draft did not
fully reach the GPU, --fit pushed layers to RAM to make room for the draft —
the engine runs, slower than without it — so the mark is recorded as failed
and the next start runs without automatic speculation. The journal gets a
structured entry (``MESSAGE_ID`` :data:`MESSAGE_AUTO_CUT`) saying so.

A start whose engine runs on the CPU although it has a GPU backend or says it offloaded
(issue 44, item 3: :meth:`lokid.core.telemetry.enginelog.Load.on_cpu`) is said at its "ready at"
entry whatever its speculation, as a structured entry (``MESSAGE_ID``
:data:`MESSAGE_ON_CPU`, ``LOKI_REASON``) and to ``on_cpu`` (the daemon: a preset with
``cpu_fallback = "fail"`` is stopped there); an engine that ran 10-100x slower looked
healthy before. On an automatic launch it also cuts automatic speculation (the
layers-in-RAM verdict counts it).

Lines journald dropped (its ``Suppressed N messages from loki-engine@P.service`` entry,
read by :mod:`lokid.core.telemetry.journalgap`; issue 45, item 9) go to ``on_gap`` (the daemon's
meters: counts become a lower bound, requests in flight unknown) and are said once per
start, with what they cost lokid, as a structured entry (``MESSAGE_ID``
:data:`MESSAGE_LINES_LOST`); later drops of that start are counted, not said again.

If a whole load goes by without any line the parser knows, the engine's log
format has probably changed: a warning says so.

The journal's fd is integrated into asyncio with ``add_reader`` (no polling
loop); :meth:`JournalWatcher.drain` is also usable synchronously, on journal
files (``systemd.journal.Reader(files=…)``) in tests.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from systemd import journal

from ..core.errors import StalePlanError, StateError
from ..core.names import (
    ENGINE_SLICE,
    MESSAGE_AUTO_CUT,
    MESSAGE_FORMAT_UNKNOWN,
    MESSAGE_LINES_LOST,
    MESSAGE_ON_CPU,
    SYSLOG_IDENTIFIER,
    preset_of_unit,
)
from ..core.telemetry.enginelog import LoadTracker
from ..core.telemetry.journalgap import JOURNAL_DROPPED, dropped, match_dropped
from ..store.runtimedir import read_runtime_plan
from ..store.state import StateDB

READY_PREFIX = "ready at "


@dataclass
class Invocation:
    preset: str
    invocation: str
    tracker: LoadTracker = field(default_factory=LoadTracker)
    judged: bool = False    # its "ready at" entry was seen
    cut: bool = False       # a verdict was recorded for it
    on_cpu: bool = False    # its running on the CPU was said
    lost: int = 0           # lines journald said it dropped (said once, then counted)


@dataclass(frozen=True)
class AutoCut:
    """Automatic speculation was cut for the configuration of one start."""

    preset: str
    invocation: str
    reason: str


class LoadJudge:
    """Turns engine log entries (journal fields) into verdicts recorded in the state DB.

    Fed by :class:`JournalWatcher` under systemd, and by the local runner with
    the lines it reads from the engine's pipe, shaped as the same fields.
    """

    def __init__(self, state_dir: str, runtime_dir: str,
                 on_verdict: Callable[[AutoCut], None] | None = None,
                 log: Callable[..., None] | None = None,
                 on_line: Callable[[str, str, str, float | None], None] | None = None,
                 on_cpu: Callable[[AutoCut], None] | None = None,
                 on_gap: Callable[[str, str, int, float | None], None] | None = None):
        self.state_dir = state_dir
        # lines of a start that journald dropped: (preset, invocation or "", count, time)
        self.on_gap = on_gap
        # a start that runs on the CPU (its reason in an AutoCut's shape), once per start
        self.on_cpu = on_cpu
        self.runtime_dir = runtime_dir
        self.on_verdict = on_verdict
        # every engine line, for telemetry: (preset, invocation, line, its time or None)
        self.on_line = on_line
        self.log = log or journal.send
        self.invocations: dict[str, Invocation] = {}
        self.verdicts: list[AutoCut] = []
        self.unreadable = 0   # engine lines the parser failed on (skipped, each alone)

    def handle(self, entry: dict[str, Any]) -> None:
        lost = dropped(entry)
        if lost is not None:
            self.lines_lost(*lost, _entry_time(entry))
            return
        preset = preset_of_unit(str(entry.get("_SYSTEMD_UNIT", "")))
        invocation = str(entry.get("_SYSTEMD_INVOCATION_ID", "") or "")
        message = entry.get("MESSAGE", "")
        if isinstance(message, bytes):
            message = message.decode("utf-8", "replace")
        if preset is None or not invocation or not isinstance(message, str):
            return
        if entry.get("SYSLOG_IDENTIFIER") == SYSLOG_IDENTIFIER and entry.get("LOKI_PRESET"):
            inv = self._invocation(preset, invocation)
            if message.startswith(READY_PREFIX) and not inv.judged:
                inv.judged = True
                self._judge(inv)
            return
        self.engine_lines(preset, invocation, message.splitlines(), _entry_time(entry))

    def engine_lines(self, preset: str, invocation: str, lines: list[str],
                     at: float | None = None) -> None:
        """Lines the engine of ``preset``'s start ``invocation`` printed (``at``: their
        time, None for now): what :meth:`handle` does with an engine entry's MESSAGE, for
        a caller that has the lines without journal fields (the local runner's pipe)."""
        inv = self._invocation(preset, invocation)
        late_offload = False
        feed, on_line = inv.tracker.feed, self.on_line
        for line in lines:
            # One line at a time: a line the parser cannot read (a defect of ours) is
            # counted and skipped, never the rest of its batch (telemetry's lines too).
            try:
                event = feed(line)
            except Exception as e:
                self._unreadable(preset, e)
                event = None
            late_offload |= event is not None and event.kind == "offloaded"
            if on_line is not None:
                on_line(preset, invocation, line, at)
        if late_offload and inv.judged and not inv.cut:
            # The engine's lines and lokid's "ready at" entry reach the journal by
            # different streams: an offload line may land after it.
            self._judge(inv, late=True)

    def lines_lost(self, preset: str, invocation: str, count: int,
                   at: float | None = None) -> None:
        """journald dropped ``count`` lines of ``preset``'s start ``invocation`` (""
        unknown): told to ``on_gap``, and said once per start."""
        if self.on_gap is not None:
            self.on_gap(preset, invocation, count, at)
        key = invocation or next((k for k, v in reversed(self.invocations.items())
                                  if v.preset == preset), "")
        inv = self._invocation(preset, key) if key else None
        if inv is not None and inv.lost:
            inv.lost += count
            return
        if inv is not None:
            inv.lost = count
        self.log(f"preset {preset}: journald dropped {count} lines of its engine before lokid "
                 "read them: its request counts are a lower bound and its requests in flight "
                 "unknown until every slot is seen again (no idle stop until then); see "
                 "LogRateLimitIntervalSec= in loki-engine@.service(8)",
                 MESSAGE_ID=MESSAGE_LINES_LOST, PRIORITY=4, LOKI_PRESET=preset,
                 LOKI_LINES_LOST=str(count), SYSLOG_IDENTIFIER=SYSLOG_IDENTIFIER)

    def _unreadable(self, preset: str, error: Exception) -> None:
        self.unreadable += 1
        if self.unreadable == 1:  # once: a parser defect would repeat on every such line
            self.log(f"preset {preset}: an engine line could not be read ({type(error).__name__}: "
                     f"{str(error)[:200]}); it is skipped, later ones are only counted",
                     PRIORITY=4, LOKI_PRESET=preset, SYSLOG_IDENTIFIER=SYSLOG_IDENTIFIER)

    def _invocation(self, preset: str, invocation: str) -> Invocation:
        inv = self.invocations.get(invocation)
        if inv is None:
            inv = self.invocations[invocation] = Invocation(preset, invocation)
            # a new start of this preset: forget its older invocations
            for key in [k for k, v in self.invocations.items()
                        if v.preset == preset and k != invocation]:
                del self.invocations[key]
        return inv

    def _judge(self, inv: Invocation, late: bool = False) -> None:
        load = inv.tracker.current or inv.tracker.before
        if not late and load.known == 0 and inv.tracker.before.known == 0:
            self.log(f"no known llama-server line during the load of preset {inv.preset}: "
                     "the engine's log format may have changed, lokid's verdicts are blind",
                     MESSAGE_ID=MESSAGE_FORMAT_UNKNOWN, PRIORITY=4, LOKI_PRESET=inv.preset,
                     SYSLOG_IDENTIFIER=SYSLOG_IDENTIFIER)
        cpu = load.on_cpu()
        if cpu and not inv.on_cpu:
            inv.on_cpu = True
            self.log(f"preset {inv.preset}: its engine runs on the CPU: {cpu}",
                     MESSAGE_ID=MESSAGE_ON_CPU, PRIORITY=4, LOKI_PRESET=inv.preset,
                     LOKI_REASON=cpu, SYSLOG_IDENTIFIER=SYSLOG_IDENTIFIER)
            if self.on_cpu is not None:
                self.on_cpu(AutoCut(inv.preset, inv.invocation, cpu))
        why = load.layers_in_ram()
        if not why:
            return
        try:
            rp = read_runtime_plan(self.runtime_dir, inv.preset, inv.invocation)
        except StalePlanError:
            return  # no plan of this start any more: nothing to attribute the verdict to
        if not rp.auto:
            return  # forced or no speculation: the operator chose it
        try:
            with StateDB(self.state_dir) as db:
                db.record_failure(inv.preset, rp.mark, why)
        except StateError as e:
            # The verdict cannot be kept: say so, and say it once for this start.
            inv.cut = True
            self.log(f"preset {inv.preset}: {why}, but it cannot be recorded ({e}): the next "
                     "start will try automatic speculative decoding again",
                     PRIORITY=3, LOKI_PRESET=inv.preset, SYSLOG_IDENTIFIER=SYSLOG_IDENTIFIER)
            return
        inv.cut = True
        verdict = AutoCut(inv.preset, inv.invocation, why)
        self.verdicts.append(verdict)
        self.log(f"preset {inv.preset}: automatic speculative decoding cut for the next start: "
                 f"{why} (mode = \"mtp\" forces it)",
                 MESSAGE_ID=MESSAGE_AUTO_CUT, PRIORITY=4, LOKI_PRESET=inv.preset,
                 LOKI_REASON=why, SYSLOG_IDENTIFIER=SYSLOG_IDENTIFIER)
        if self.on_verdict is not None:
            self.on_verdict(verdict)


def _entry_time(entry: dict[str, Any]) -> float | None:
    """When the journal received an entry (seconds since the epoch), None when unknown."""
    stamp = entry.get("__REALTIME_TIMESTAMP")
    if stamp is None:
        return None
    try:
        return float(stamp.timestamp())
    except (AttributeError, OverflowError, OSError, ValueError):
        return None


class JournalWatcher(LoadJudge):
    """A :class:`LoadJudge` reading the journal of the engine units."""

    def __init__(self, reader: Any, state_dir: str, runtime_dir: str, **kw: Any):
        super().__init__(state_dir, runtime_dir, **kw)
        self.reader = reader
        self.since: float | None = None
        reader.add_match(_SYSTEMD_SLICE=ENGINE_SLICE)
        match_dropped(reader)   # journald's own entries: its slice is not the engines'

    @classmethod
    def system(cls, state_dir: str, runtime_dir: str, **kw: Any) -> JournalWatcher:
        """A watcher on the system journal, from its end (only what happens from now);
        ``since`` is the time of the last entry before that end (what came before is
        :func:`invocation_lines`' to read)."""
        import time

        reader = journal.Reader(flags=journal.SYSTEM_ONLY)
        reader.seek_tail()
        last = reader.get_previous()
        watcher = cls(reader, state_dir, runtime_dir, **kw)
        watcher.since = _entry_time(last) or time.time()
        return watcher

    def drain(self) -> int:
        """Handle every entry available now; return how many."""
        count = 0
        for entry in self.reader:
            self.handle(entry)
            count += 1
        return count

    def attach(self, loop: asyncio.AbstractEventLoop) -> None:
        """Follow the journal from the event loop: its fd wakes us, no polling."""
        fd = self.reader.fileno()

        def ready() -> None:
            if self.reader.process() != journal.NOP:
                self.drain()

        loop.add_reader(fd, ready)
        self.drain()

    def detach(self, loop: asyncio.AbstractEventLoop) -> None:
        loop.remove_reader(self.reader.fileno())


# What a replay reads of one start: its first entries (the load: buffer sizes, offload),
# then the last minutes (what the windows need). Between the two, nothing.
REPLAY_HEAD = 5000
REPLAY_WINDOW = 300.0


def invocation_lines(reader: Any, invocation: str, until: float, head: int = REPLAY_HEAD,
                     window: float = REPLAY_WINDOW) -> tuple[list[tuple[str, float]], float | None]:
    """The engine lines of start ``invocation`` up to ``until`` (inclusive), each with its
    time, from ``reader`` (the system journal, or journal files in tests): its first
    ``head`` entries, then those of the last ``window`` seconds before ``until``. The
    second value is where counting resumed after a gap (None: nothing was left out)."""
    import datetime

    reader.add_match(_SYSTEMD_INVOCATION_ID=invocation)
    reader.seek_head()
    out: list[tuple[str, float]] = []
    resumed = None
    count = 0
    while True:
        entry = reader.get_next()
        if not entry:
            break
        at = _entry_time(entry)
        if at is None or at > until:
            break
        if entry.get("SYSLOG_IDENTIFIER") != SYSLOG_IDENTIFIER:  # lokid's own lines: not
            message = entry.get("MESSAGE", "")                   # the engine's
            if isinstance(message, bytes):
                message = message.decode("utf-8", "replace")
            if isinstance(message, str):
                out.extend((line, at) for line in message.splitlines())
        count += 1
        if count == head and at < until - window:
            resumed = until - window
            reader.seek_realtime(datetime.datetime.fromtimestamp(resumed))
    return out, resumed


def invocation_drops(reader: Any, invocation: str, until: float) -> list[tuple[int, float]]:
    """journald's word that it dropped lines of start ``invocation`` up to ``until``: (lines
    dropped, when said) each, oldest first (a replay after the daemon's restart keeps a
    start's counts a lower bound, :mod:`lokid.core.telemetry.journalgap`)."""
    reader.add_match(MESSAGE_ID=JOURNAL_DROPPED, _TRANSPORT="driver",
                     OBJECT_SYSTEMD_INVOCATION_ID=invocation)
    reader.seek_head()
    out: list[tuple[int, float]] = []
    while True:
        entry = reader.get_next()
        if not entry:
            return out
        at = _entry_time(entry)
        if at is None or at > until:
            return out
        lost = dropped(entry)
        if lost is not None:
            out.append((lost[2], at))
