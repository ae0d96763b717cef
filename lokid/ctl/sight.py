"""How lokictl words the presets served on demand: their state, the last request, who
holds their GPU group, and their counters (cold starts, swaps, the gateway's requests),
from the preset's properties (``OnDemandState``, ``LastRequestAt``, ``GroupHolder``,
``IdleStopAt``) and its Stats (:mod:`lokid.dbus.sight`)."""

from __future__ import annotations

from typing import Any

from ..core.serve.tables import span_text


def ago(at: float, now: float) -> str:
    """A past time as a person reads it: "just now", "12s ago", "5min ago"."""
    left = now - at
    if left < 1:
        return "just now"
    return f"{span_text(left if left < 60 else round(left / 60) * 60)} ago"


def holder_text(row: dict[str, Any]) -> str:
    """"group gpu0 held by beta", "group gpu0 free", or "" without a group."""
    group = row.get("Group") or ""
    if not group:
        return ""
    holder = row.get("GroupHolder") or ""
    return f"group {group} " + (f"held by {holder}" if holder else "free")


def sight_text(row: dict[str, Any], now: float) -> str:
    """One line: "waiting for a request, last request 5min ago, group gpu0 held by beta";
    "" for a preset started by hand only, without a group."""
    parts = [row.get("OnDemandState") or ""]
    if row.get("OnDemandState") and row.get("LastRequestAt"):
        parts.append(f"last request {ago(float(row['LastRequestAt']), now)}")
    parts.append(holder_text(row))
    return ", ".join(p for p in parts if p)


def counters_text(stats: dict[str, Any]) -> str:
    """The on-demand counters of a preset's Stats: "1 cold start (mean wait 2.3 s, last
    2.3 s), 2 group swaps, 3 evictions (cut 1, room 2), gateway: 200 x3, 503 x1"; ""
    when there is none."""
    from ..core.wording import counted

    parts = []
    if stats.get("cold_starts"):
        text = counted(int(stats["cold_starts"]), "cold start")
        waits = int(stats.get("cold_start_waits") or 0)
        if waits:
            mean = float(stats.get("cold_start_wait_seconds") or 0.0) / waits
            text += (f" (mean wait {mean:.1f} s, last "
                     f"{float(stats.get('cold_start_last_wait_seconds') or 0.0):.1f} s)")
        parts.append(text)
    if stats.get("group_swaps"):
        parts.append(counted(int(stats["group_swaps"]), "group swap"))
    evictions = stats.get("evictions") or {}
    if evictions:
        parts.append(counted(sum(int(n) for n in evictions.values()), "eviction")
                     + f" ({', '.join(f'{why} {n}' for why, n in sorted(evictions.items()))})")
    codes = stats.get("gateway_requests") or {}
    if codes:
        parts.append("gateway: " + ", ".join(f"{code} x{n}" for code, n in sorted(codes.items())))
    return ", ".join(parts)

