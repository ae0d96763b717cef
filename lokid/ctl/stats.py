"""``lokictl top`` and ``lokictl stats``: what every engine does, from the daemon's Stats.

``top`` is a live table, one row per preset (state, URL, model, uptime, GPU memory
per device, offload, requests/min, prefill and decode tok/s, draft acceptance, the
last verdict), refreshed each second until ``q`` or Ctrl-C; ``--once`` prints it
once, ``--json`` prints the rows once as JSON. ``stats PRESET`` prints one preset's
figures; with ``--since TIME`` (any time ``journalctl --since`` takes, such as
``"1h ago"``) the daemon recomputes them from the engine's journal over that window
(:mod:`lokid.ctl.logs`), with the parser of its Stats: the journal is the history,
nothing else is kept.

The formatting is here, apart from the D-Bus client (:mod:`lokid.ctl.client`), which only
hands it the preset properties.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterable
from typing import Any

from ..core.wording import counted

HOST_DEVICES = ("CPU", "CPU_Mapped", "CPU_REPACK")


def gpu_memory(memory_mib: dict[str, float] | None) -> dict[str, float]:
    """MiB per GPU device (every kind summed); host buffers (CPU, *_Host) left out."""
    out: dict[str, float] = {}
    for key, mib in (memory_mib or {}).items():
        device = key.split(" ", 1)[0]
        if device in HOST_DEVICES or device.endswith("_Host"):
            continue
        out[device] = out.get(device, 0.0) + float(mib)
    return out


def _mib(mib: float) -> str:
    return f"{mib / 1024:.1f}G" if mib >= 1024 else f"{mib:.0f}M"


def duration(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    s = int(seconds)
    if s >= 86400:
        return f"{s // 86400}d{s % 86400 // 3600}h"
    if s >= 3600:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    if s >= 60:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s}s"


def _num(value: Any, fmt: str = "{:.0f}") -> str:
    return "-" if value is None else fmt.format(value)


def row(props: dict[str, Any]) -> dict[str, Any]:
    """One preset's line of ``top`` (and of ``presets``), from its D-Bus properties."""
    live = props.get("State") in ("loading", "ready", "stopping")
    # a stopped engine's figures are its last start's: the totals stay (JSON), the live
    # columns (where it answers, its speeds, its memory) do not
    stats = dict(props.get("Stats") or {})
    draft = stats.get("draft") or {}
    prefill = stats.get("prefill_tps") or {}
    decode = stats.get("decode_tps") or {}
    external = props.get("Kind") == "external"   # an API elsewhere: where, and its model
    state = "external" if external else props.get("State")
    if external:
        url = props.get("Url") or None
    else:
        url = stats.get("url") if live else None
    return {
        "preset": props.get("Name"), "state": state, "url": url,
        "model": (props.get("UpstreamModel") or None) if external else props.get("Model"),
        # what an external API or a broken preset says instead of a verdict
        "reachable": (props.get("Reachable") or None) if external else None,
        "error": props.get("Error") or None,
        "uptime_seconds": stats.get("uptime_seconds") if live else None,
        "gpu_memory_mib": gpu_memory(stats.get("memory_mib")) if live else {},
        "memory_source": stats.get("memory_source"),
        "offload": list(stats.get("offload") or []),
        # why its GPU engine runs on the CPU (issue 44, item 3), "" when nothing says so
        "on_cpu": stats.get("on_cpu") or "",
        "requests": stats.get("requests"),
        "requests_per_min": stats.get("requests_per_min") if live else None,
        "prefill_tps": _recent(prefill) if live else None,
        "decode_tps": _recent(decode) if live else None,
        "draft_kind": draft.get("kind"), "draft_acceptance": draft.get("acceptance"),
        "verdict": props.get("AutoSpecBlocked") or "",
        # served on demand (lokid.ctl.sight): its state, last request, group and counters
        "on_demand_state": props.get("OnDemandState") or "",
        "last_request_at": props.get("LastRequestAt") or None,
        "idle_stop_at": props.get("IdleStopAt") or None,
        "group": props.get("Group") or "", "group_holder": props.get("GroupHolder") or "",
        **{k: stats[k] for k in SIGHT_KEYS if k in stats},
        # its engines past the first (issue 47): each its own unit, port and state
        "replicas": [{k: rep.get(k) for k in ("index", "instance", "unit", "state", "port",
                                              "url", "in_flight")}
                     for rep in props.get("Replicas") or [] if rep.get("index", 1) > 1],
    }


SIGHT_KEYS = ("cold_starts", "cold_start_waits", "cold_start_wait_seconds",
              "cold_start_last_wait_seconds", "gateway_requests", "group_swaps")


def _recent(speeds: dict[str, Any]) -> Any:
    """The last minute's speed, else the whole start's."""
    return speeds.get("1m") if speeds.get("1m") is not None else speeds.get("all")


COLUMNS = ("PRESET", "STATE", "URL", "MODEL", "UP", "GPU MEM", "OFFLOAD", "REQ/MIN",
           "PREFILL", "DECODE", "DRAFT", "VERDICT")


def gpu_text(r: dict[str, Any]) -> str:
    """A row's GPU memory as shown: "CUDA0 3.5G CUDA1 2.0G", or "-"."""
    return " ".join(f"{d} {_mib(m)}" for d, m in sorted(r["gpu_memory_mib"].items())) or "-"


def cells(r: dict[str, Any]) -> list[str]:
    draft = "-"
    if r["draft_acceptance"] is not None:
        draft = f"{r['draft_acceptance'] * 100:.0f}% {r['draft_kind'] or ''}".strip()
    state = str(r["state"])
    if r.get("on_demand_state") and r["on_demand_state"] != state:
        state += f" ({r['on_demand_state']})"
    said = r["verdict"] or r.get("on_cpu") or r.get("reachable") or r.get("error")
    offload = ",".join(r["offload"])
    if r.get("on_cpu"):   # "3/3" of an engine on the CPU is no offload at all
        offload = f"{offload} CPU".strip()
    return [str(r["preset"]), state, r["url"] or "-", str(r["model"] or "-"),
            duration(r["uptime_seconds"]), gpu_text(r), offload or "-",
            _num(r["requests_per_min"], "{:.1f}"), _num(r["prefill_tps"]),
            _num(r["decode_tps"]), draft, said or "-"]


def columns(lines: list[list[str]], width: int | None = None) -> str:
    """Lines of cells as aligned columns, the last one left free (and cut, with the
    line, to ``width``)."""
    widths = [max(len(line[i]) for line in lines) for i in range(len(lines[0]) - 1)]
    out = []
    for line in lines:
        text = "  ".join(c.ljust(w) for c, w in zip(line[:-1], widths, strict=True))
        text += "  " + line[-1]
        out.append(text[:width] if width else text)
    return "\n".join(out)


def table(rows: Iterable[dict[str, Any]], width: int | None = None) -> str:
    """The rows as ``top`` shows them (the verdict, last, is cut to ``width``)."""
    lines = [list(COLUMNS)]
    for r in rows:
        lines.append(cells(r))
        # each replica its own line below its preset's, by its instance name (NAME:k)
        lines += [[f"  {rep['instance']}", str(rep["state"]),
                   (rep["url"] or "-") if rep["state"] in ("loading", "ready") else "-",
                   *["-"] * (len(COLUMNS) - 4), f"{rep['in_flight'] or 0} in flight"]
                  for rep in r.get("replicas") or [] if rep["state"] != "inactive"]
    return columns(lines, width)


DEVICE_COLUMNS = ("DEVICE", "TOTAL", "LOKID", "OTHERS", "RESERVED", "FREE", "FROM")


def _gib(n: Any) -> str:
    """Bytes as top shows memory: "17.6G", or "512M" under a GiB."""
    if not isinstance(n, (int, float)):
        return "-"
    return f"{n / 2**30:.1f}G" if n >= 2**30 else f"{n / 2**20:.0f}M"


def need_text(memory: dict[str, Any]) -> str:
    """A preset's Memory in a few characters: "GPU0 17.6G host 0.5G est" ("measured" where
    every figure was), "-" without one."""
    needs = memory.get("needs") or {}
    if not needs:
        return "-"
    sources = memory.get("sources") or {}
    text = " ".join(f"{d} {_gib(n)}" for d, n in sorted(needs.items(), key=lambda i: (
        i[0] == "host", i[0])))
    if memory.get("gpu_count"):
        text += f" {memory['gpu_count']}x{_gib(memory.get('per_gpu'))}"
    measured = [s for s in sources.values() if s != "estimate"]
    return text + (" measured" if measured and len(measured) == len(sources) else
                   " est" if not measured else " part measured")


def devices_table(rows: Iterable[dict[str, Any]], width: int | None = None) -> str:
    """The manager's Devices as ``top`` shows them under the presets: per device its
    total, what lokid's engines hold, what others hold, the reserve and what is free;
    then what could not be read."""
    rows = list(rows)
    lines = [list(DEVICE_COLUMNS)]
    notes: list[str] = []
    for r in rows:
        label = str(r.get("device", "?")) + (f" ({r['name']})" if r.get("name") else "")
        lines.append([label, _gib(r.get("total")), _gib(r.get("lokid")), _gib(r.get("others")),
                      _gib(r.get("reserve")), _gib(r.get("free")), str(r.get("source") or "-")])
        notes += [str(n) for n in r.get("notes") or []]
    text = columns(lines, width) if rows else "no device read yet"
    return text + "".join(f"\n  note: {n}"[:width + 9 if width else None] for n in notes)


def waits_text(waits: dict[str, Any], width: int | None = None) -> str:
    """The manager's Waits under the devices: why each preset's requests wait for
    memory, as the gateway's placement says it ("" when nothing waits)."""
    if not waits:
        return ""
    lines = [f"  {name}: {why}" for name, why in sorted(waits.items())]
    return "waiting for memory:\n" + "\n".join(
        line if width is None or len(line) <= width else line[:width - 1] + "…"
        for line in lines)


def queues_text(queues: list[dict[str, Any]], width: int | None = None) -> str:
    """The gateway's waiting requests (Usage's Queues) under the devices: per preset, key
    and why, how many wait and the oldest one's wait ("" when none waits)."""
    if not queues:
        return ""
    lines = [["  PRESET", "KEY", "CLASS", "WAITING", "OLDEST", "WHY"]] + [
        ["  " + str(q.get("preset")), str(q.get("key")), str(q.get("class")),
         str(q.get("waiting")), f"{float(q.get('oldest_s') or 0):.0f} s", str(q.get("why"))]
        for q in queues]
    return "waiting requests:\n" + columns(lines, width)


def peers_text(peers: dict[str, Any], width: int | None = None) -> str:
    """The manager's Peers under the devices: each peer gateway up or down with why
    ("" without peers)."""
    if not peers:
        return ""
    lines = [f"  {name}: {'up' if not why else 'DOWN: ' + str(why)}"
             for name, why in sorted(peers.items())]
    return "peer gateways:\n" + "\n".join(
        line if width is None or len(line) <= width else line[:width - 1] + "…"
        for line in lines)


def print_json(data: Any) -> None:
    print(json.dumps(data, indent=2, ensure_ascii=False))


def stats_text(name: str, stats: dict[str, Any], since: str | None = None) -> str:
    """One preset's figures, for ``lokictl stats``; ``since``: the window asked for (the
    figures are the journal's over it, every start in it, not one start's)."""
    if since is not None and not stats.get("requests"):
        return f"{name}: no request since {since}"
    if not stats.get("requests") and not stats.get("invocation"):
        return f"{name}: no start seen yet"
    prefill = stats.get("prefill_tps") or {}
    decode = stats.get("decode_tps") or {}
    least = "at least " if stats.get("requests_lower_bound") else ""
    lines = [f"{name}: {least}{counted(stats.get('requests') or 0, 'request')}, "
             f"{stats.get('prompt_tokens', 0)} prompt tokens, "
             f"{stats.get('generated_tokens', 0)} generated"
             + (f" ({_num(stats.get('requests_per_min'), '{:.1f}')} in the last minute)"
                if stats.get("requests_per_min") is not None else "")]
    for label, d in (("prefill", prefill), ("decode", decode)):
        lines.append(f"  {label} tok/s: 1m {_num(d.get('1m'))}, 5m {_num(d.get('5m'))}, "
                     f"all {_num(d.get('all'))}; per request p50 {_num(d.get('p50'))}, "
                     f"p95 {_num(d.get('p95'))}")
    draft = stats.get("draft")
    if draft:
        lines.append(f"  draft ({draft.get('kind') or 'unknown kind'}): "
                     f"{draft.get('accepted')} of {draft.get('generated')} accepted "
                     f"({_num((draft.get('acceptance') or 0) * 100)}%), mean length "
                     f"{_num(draft.get('mean_len'), '{:.2f}')}")
    if stats.get("load_seconds") is not None or stats.get("offload"):
        lines.append(f"  load: {_num(stats.get('load_seconds'), '{:.1f}')} s, offloaded "
                     f"{', '.join(stats.get('offload') or []) or 'n/a'}")
    if stats.get("requests_lower_bound"):   # lines journald dropped (issue 45, item 9)
        lines.append(f"  journald dropped {stats.get('missed_lines', 0)} engine lines: the "
                     "counts are a lower bound"
                     + ("; requests in flight unknown, no idle stop until every slot is seen "
                        "again" if stats.get("in_flight_known") is False else ""))
    if stats.get("on_cpu"):
        lines.append(f"  on the CPU: {stats['on_cpu']}")
    memory = stats.get("memory_mib") or {}
    if memory:
        lines.append("  memory (" + str(stats.get("memory_source") or "engine log") + "): "
                     + ", ".join(f"{k} {_mib(v)}" for k, v in sorted(memory.items())))
    elif stats.get("memory_note"):
        lines.append(f"  memory: unknown: {stats.get('memory_note')}")
    if stats.get("uptime_seconds") is not None:
        lines.append(f"  up {duration(stats.get('uptime_seconds'))}"
                     + (f", {stats.get('in_flight')} in flight" if stats.get("in_flight")
                        else ""))
    return "\n".join(lines)


def write(text: str) -> None:
    sys.stdout.write(text)
    sys.stdout.flush()
