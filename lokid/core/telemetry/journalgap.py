"""journald's word that it dropped a unit's lines → which engine start lost how many (pure).

Issue 45, item 9: under a team's load (157 requests/s, 7 lines each) journald's default
rate limit dropped 18,582 lines of ``loki-engine@gamma.service`` in 120 s, and lokid's
Stats, ``lokid_requests_total`` and ``lokictl stats --since`` counted 67 % of the requests
without a word. The engine units now set a limit no engine reaches
(``units/loki-engine@.service`` says why), but a drop must still be seen whatever causes
it (a drop-in that sets a lower limit back): lokid reads journald's own entry about it.

When journald's rate limit for a unit ends after dropping lines, its next line from that
unit is preceded by one entry of journald itself (``journald-server.c``,
``server_dispatch_message``): ``MESSAGE_ID=``:data:`JOURNAL_DROPPED` (systemd's
``SD_MESSAGE_JOURNAL_DROPPED``), ``MESSAGE=Suppressed N messages from UNIT``,
``N_DROPPED=N``, and the dropping process's unit and start as ``OBJECT_SYSTEMD_UNIT=`` and
``OBJECT_SYSTEMD_INVOCATION_ID=`` (its own ``_SYSTEMD_UNIT`` is systemd-journald's, so a
reader matching the engines' units or slice never sees it: match the id too,
:func:`match_dropped`).

:func:`dropped` reads such an entry: the fields first, the message's own words where a
field is missing (the count is then that of the message; neither: 1, "some were lost").
A count is bounded (:data:`MAX_DROPPED`), so a forged or garbled entry cannot make a giant
number. Only journald may say it: an entry whose ``_TRANSPORT`` is not ``driver``
(journald's own) is any process's claim, and is ignored.
"""

from __future__ import annotations

import re
import uuid
from typing import Any

from ..names import preset_of_unit

# systemd's sd-messages.h SD_MESSAGE_JOURNAL_DROPPED: "journal messages dropped"
JOURNAL_DROPPED = "a596d6fe7bfa4994828e72309e95d61e"
MAX_DROPPED = 10**12
_SAID = re.compile(r"Suppressed (\d{1,13}) messages from (\S{1,256})")


def _text(value: Any) -> str:
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return value if isinstance(value, str) else str(value) if value is not None else ""


def dropped(entry: dict[str, Any]) -> tuple[str, str, int] | None:
    """(preset, invocation or "", lines dropped) for journald's entry saying it dropped lines
    of an engine unit; None for any other entry."""
    mid = entry.get("MESSAGE_ID")   # python-systemd's reader gives a uuid.UUID
    if (mid.hex if isinstance(mid, uuid.UUID) else _text(mid).lower()) != JOURNAL_DROPPED:
        return None
    if _text(entry.get("_TRANSPORT")) != "driver":
        return None
    said = _SAID.search(_text(entry.get("MESSAGE"))[:512])
    unit = _text(entry.get("OBJECT_SYSTEMD_UNIT")) or (said[2] if said else "")
    preset = preset_of_unit(unit)
    if preset is None:
        return None
    raw = _text(entry.get("N_DROPPED")).strip()
    count = int(raw) if raw.isdigit() and len(raw) <= 13 else int(said[1]) if said else 1
    invocation = _text(entry.get("OBJECT_SYSTEMD_INVOCATION_ID")).strip().lower()
    if not re.fullmatch(r"[0-9a-f]{32}", invocation):
        invocation = ""
    return preset, invocation, min(max(count, 1), MAX_DROPPED)


def match_dropped(reader: Any, unit: str | None = None) -> None:
    """Add, as a disjunction to ``reader``'s matches, journald's drop entries (about
    ``unit`` only, when given)."""
    reader.add_disjunction()
    reader.add_match(MESSAGE_ID=JOURNAL_DROPPED, _TRANSPORT="driver")
    if unit is not None:
        reader.add_match(OBJECT_SYSTEMD_UNIT=unit)
