"""Who waits, where and why (issue 46, item 4): the rows the gateway reports to the daemon
(``org.lokid.Lokid1.Usage.ReportQueues``) and the daemon shows (its ``Queues`` property,
``lokictl top``, the Cockpit page).

One row per (preset, key, class, why): how many of that key's requests wait there and
the oldest one's wait in seconds. Rules, each for the failure it prevents:

- **one report replaces the last** (as ``ReportWaits`` does): rows never add up across
  reports, so a report lost or repeated cannot leave a count too high;
- **the daemon ages the oldest wait itself** (the seconds reported plus the time since
  the report): the gateway then reports only when a count or a why changes, not each
  second because a wait grew by one;
- **a word not repeated is forgotten** (:data:`FRESH`): the gateway says it again every
  :data:`REPEAT` seconds while anything waits, so a gateway killed mid-wait leaves no
  queue on show for ever;
- **bounded**: at most :data:`MAX_ROWS` rows, names by their rules, a why of at most
  :data:`MAX_WHY` characters (printable): the daemon keeps what anyone may read.

Part of the pure core: no I/O; every call is given ``now``.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from ..config.presetname import valid_preset_name
from ..errors import InvalidArgsError, printable
from .keys import BATCH, INTERACTIVE
from .usage import key_ok

MAX_ROWS = 4096        # rows of one ReportQueues
MAX_WHY = 200          # characters of one why
MAX_COUNT = 1_000_000  # requests of one row
MAX_AGE = 10 ** 7      # seconds of one oldest wait
REPEAT = 10.0          # seconds between two reports of the same rows while any wait
FRESH = 30.0           # seconds a report holds once not repeated


@dataclass(frozen=True)
class Row:
    preset: str
    key: str
    batch: bool
    waiting: int
    oldest: float   # seconds the oldest of them waited when reported
    why: str

    def same(self) -> tuple[str, str, bool, int, str]:
        """What a change is judged on (not the oldest wait, which grows by itself)."""
        return (self.preset, self.key, self.batch, self.waiting, self.why)

    def wire(self) -> list[Any]:
        """As ReportQueues takes it: (ssbuds)."""
        return [self.preset, self.key, self.batch, self.waiting, float(self.oldest),
                self.why[:MAX_WHY]]

    def shown(self, aged: float) -> dict[str, Any]:
        """As the Queues property and ``lokictl top --json`` give it."""
        return {"preset": self.preset, "key": self.key,
                "class": BATCH if self.batch else INTERACTIVE, "waiting": self.waiting,
                "oldest_s": round(self.oldest + max(0.0, aged), 1), "why": self.why}


def changed(before: Iterable[Row], after: Iterable[Row]) -> bool:
    return sorted(r.same() for r in before) != sorted(r.same() for r in after)


def check_rows(rows: Any) -> list[Row]:
    """ReportQueues' rows, checked whole: InvalidArgsError naming the first bad one."""
    if len(rows) > MAX_ROWS:
        raise InvalidArgsError(f"ReportQueues: {len(rows)} rows, at most {MAX_ROWS}")
    out = []
    for n, raw in enumerate(rows, 1):
        preset, key, batch, waiting, oldest, why = raw
        if not valid_preset_name(preset):
            raise InvalidArgsError(f"ReportQueues: row {n}: preset {printable(preset[:64])!r} "
                                   "is no preset name")
        if not key_ok(key):
            raise InvalidArgsError(f"ReportQueues: row {n}: key {printable(key[:64])!r} is "
                                   "no key name")
        if not 0 < waiting <= MAX_COUNT or not 0.0 <= oldest <= MAX_AGE:
            raise InvalidArgsError(f"ReportQueues: row {n}: {waiting} waiting (1 to "
                                   f"{MAX_COUNT}), oldest {oldest} s (0 to {MAX_AGE})")
        if len(why) > MAX_WHY:
            raise InvalidArgsError(f"ReportQueues: row {n}: why is {len(why)} characters, "
                                   f"at most {MAX_WHY}")
        out.append(Row(preset, key, bool(batch), int(waiting), float(oldest), printable(why)))
    return out


class Queues:
    """The daemon's copy of the gateway's last report."""

    def __init__(self) -> None:
        self.rows: list[Row] = []
        self.at = float("-inf")

    def report(self, rows: list[Row], now: float, known: Any = None) -> bool:
        """The gateway's rows, replacing the last (presets not in ``known`` left out when
        given); whether what :meth:`shown` gives changed beyond the ages."""
        before = self.current(now)
        self.rows = [r for r in rows if known is None or r.preset in known]
        self.at = now
        return changed(before, self.rows)

    def current(self, now: float) -> list[Row]:
        return [] if now - self.at > FRESH else self.rows

    def shown(self, now: float) -> list[dict[str, Any]]:
        return [r.shown(now - self.at) for r in sorted(
            self.current(now), key=lambda r: (r.preset, r.batch, r.key, r.why))]
