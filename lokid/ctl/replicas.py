"""``lokictl replica``: a preset's replicas (issue 47, :mod:`lokid.dbus.replicas`), and the
lines ``lokictl status`` adds for them.

``lokictl replica list NAME`` prints the preset's ``Replicas`` (replica 1 is the preset's
own engine); ``start NAME`` starts one more (``StartReplica``: the lowest index free,
up to the preset's ``max_replicas``) and prints its index; ``stop NAME INDEX`` stops one
(``StopReplica``; replica 1 is the preset itself, ``lokictl stop``). A daemon of a
release before replicas has no ``Replicas``: status then shows none, and the verbs say
the daemon's own error (an unknown method).
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from dbus_fast.errors import DBusError

from ..core.names import PRESET_INTERFACE
from .client import EXIT_OK, Client


def add_parsers(sub: Any) -> None:
    """``lokictl replica …`` under lokictl's command table."""
    replica = sub.add_parser("replica", help="a preset's replicas: list, start one more, "
                             "stop one")
    verbs = replica.add_subparsers(dest="replica_command", required=True)
    s = verbs.add_parser("list", help="the preset's engines: index, unit, state, port")
    s.add_argument("preset")
    s.add_argument("--json", action="store_true")
    verbs.add_parser("start", help="start one more replica (up to [serve] max_replicas); "
                     "prints its index").add_argument("preset")
    s = verbs.add_parser("stop", help="stop replica INDEX (2 and up)")
    s.add_argument("preset")
    s.add_argument("index", type=int)


async def rows_of(c: Client, name: str) -> list[dict[str, Any]]:
    """The preset's ``Replicas`` ([] from a daemon without them)."""
    props = await c.properties(await c.preset_path(name), PRESET_INTERFACE)
    return [dict(row) for row in props.get("Replicas") or []]


async def replica_rows(c: Client, names: list[str]) -> dict[str, list[dict[str, Any]]]:
    """Each preset's rows where it runs more than its own engine (for ``status``); a preset
    gone meanwhile, or a daemon without replicas, adds none."""
    out = {}
    for name in names:
        try:
            rows = await rows_of(c, name)
        except DBusError:
            continue
        if len([r for r in rows if r.get("state") != "inactive"]) > 1:
            out[name] = rows
    return out


def replica_lines(replicas: dict[str, list[dict[str, Any]]]) -> list[str]:
    """One line per preset running several engines: each engine's index, state, port."""
    return [f"replicas of {name}: " + ", ".join(
        f"{r.get('index')} {r.get('state')} :{r.get('port')}" for r in rows
        if r.get("state") != "inactive") for name, rows in sorted(replicas.items())
        if len([r for r in rows if r.get("state") != "inactive"]) > 1]


async def cmd_replica(c: Client, args: argparse.Namespace) -> int:
    verb = str(args.replica_command)
    name = str(args.preset)
    if verb == "start":
        (index,) = await c.manager("StartReplica", "s", [name])
        print(f"replica {index} of {name} is starting (loki-engine@{name}:{index})")
        return EXIT_OK
    if verb == "stop":
        (job,) = await c.manager("StopReplica", "su", [name, max(0, int(args.index))])
        print(f"replica {args.index} of {name} is stopping (job {job})")
        return EXIT_OK
    rows = await rows_of(c, name)
    if args.json:
        print(json.dumps(rows, indent=2, ensure_ascii=False))
        return EXIT_OK
    from .stats import columns

    print(columns([["INDEX", "UNIT", "STATE", "PORT", "IN FLIGHT", "STATUS"]] + [
        [str(r.get("index")), str(r.get("unit")), str(r.get("state")), str(r.get("port")),
         str(r.get("in_flight", 0)), str(r.get("status") or "-")] for r in rows]))
    return EXIT_OK
