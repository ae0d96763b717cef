"""``lokictl --hosts a,b presets|top``: the read commands across hosts, in one table with
a HOST column (issue 30, item 4).

Each host is reached as ``--host`` reaches one (ssh and systemd-stdio-bridge there, its
polkit deciding), all at once; ``.`` is this host's own bus (``--bus``/``--address``).
A host that cannot be reached is one line saying why, the others are shown, and the
exit status is 1. ``--json`` gives every row with its ``host`` (a host not reached:
``{"host", "unreachable": why}``). The table is printed
once (``watch lokictl --hosts a,b top`` refreshes it).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence
from typing import Any

from dbus_fast import BusType, DBusError
from dbus_fast.aio import MessageBus

from ..core.names import MANAGER_INTERFACE, OBJECT_PATH
from ..dbus.wire import SafeMessageBus
from . import stats as ctlstats
from .client import (
    EXIT_FAILED,
    EXIT_OK,
    EXIT_USAGE,
    Client,
    CtlError,
    close,
    connect_over_ssh,
)
from .commands import PRESETS_COLUMNS, preset_lines, shown_rows

FLEET_COMMANDS = ("presets", "top")
LOCAL = "."
MAX_HOSTS = 64


def hosts_of(text: str) -> list[str]:
    """``a,b,user@c:2222`` → the hosts, in order, each once; CtlError for none."""
    hosts: list[str] = []
    for host in (h.strip() for h in text.split(",")):
        if host and host not in hosts:
            hosts.append(host)
    if not hosts or len(hosts) > MAX_HOSTS:
        raise CtlError(f"--hosts: 1 to {MAX_HOSTS} hosts, comma-separated", EXIT_USAGE)
    return hosts


async def _gather(host: str, bus_type: BusType, address: str | None) -> dict[str, Any]:
    """One host's rows, broken presets and peers; ``{"error": why}`` when unreachable."""
    ssh = None
    bus: MessageBus
    try:
        if host == LOCAL:
            bus = await SafeMessageBus(bus_address=address, bus_type=bus_type).connect()
        else:
            bus, ssh = await connect_over_ssh(host)
    except (CtlError, OSError, ValueError, EOFError) as e:
        return {"error": str(e) or type(e).__name__}
    try:
        c = Client(bus)
        rows, broken = await shown_rows(c)
        manager = await c.properties(OBJECT_PATH, MANAGER_INTERFACE)
        return {"rows": rows, "broken": broken, "peers": dict(manager.get("Peers") or {})}
    except DBusError as e:
        if e.type == "org.freedesktop.DBus.Error.ServiceUnknown":
            return {"error": "lokid is not running there"}
        return {"error": e.text}
    finally:
        await close(bus, ssh)


async def cmd_fleet(hosts: Sequence[str], command: str, as_json: bool,
                    bus_type: BusType = BusType.SYSTEM, address: str | None = None) -> int:
    """``presets`` or ``top`` for every host, one table."""
    found = await asyncio.gather(*(_gather(h, bus_type, address) for h in hosts))
    per_host = dict(zip(hosts, found, strict=True))
    failed = any("error" in got for got in found)
    if as_json:
        out: list[dict[str, Any]] = []
        for host, got in per_host.items():
            if "error" in got:
                out.append({"host": host, "unreachable": got["error"]})
                continue
            rows = got["rows"] + [{"Name": n, "State": "broken", "Error": e}
                                  for n, e in sorted(got["broken"].items())]
            out += [{"host": host, **(ctlstats.row(r) if command == "top" else r)}
                    for r in rows]
        print(json.dumps(out, indent=2, ensure_ascii=False))
        return EXIT_FAILED if failed else EXIT_OK
    head = ["HOST", *(PRESETS_COLUMNS if command == "presets" else ctlstats.COLUMNS)]
    lines = [head]
    peers: list[str] = []
    for host, got in per_host.items():
        if "error" in got:
            lines.append([host, "-", "unreachable", *["-"] * (len(head) - 4), got["error"]])
            continue
        if command == "presets":
            cells = preset_lines(got["rows"], got["broken"])
        else:
            cells = [ctlstats.cells(ctlstats.row(r)) for r in got["rows"]] + [
                ctlstats.cells(ctlstats.row({"Name": n, "State": "broken", "Error": e}))
                for n, e in sorted(got["broken"].items())]
        lines += [[host, *line] for line in cells]
        peers += [f"{host}: {line.strip()}" for line in
                  ctlstats.peers_text(got["peers"]).splitlines()[1:]]
    print(ctlstats.columns(lines))
    if peers:
        print("\npeer gateways:\n" + "\n".join(f"  {p}" for p in peers))
    return EXIT_FAILED if failed else EXIT_OK
