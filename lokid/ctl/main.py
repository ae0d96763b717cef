"""``lokictl``'s command table: its arguments, and which command each runs.

The commands themselves: :mod:`lokid.ctl.commands` (read commands and verbs),
:mod:`lokid.ctl.edit` (``new``, ``set``, ``unset``, ``rm``, ``mv``, ``cat``, ``edit``:
preset files edited through the daemon), :mod:`lokid.ctl.logs` (``logs``, ``stats
--since``: the daemon reads the journal) and :mod:`lokid.ctl.stats` (``top``,
``stats``); the connection is :mod:`lokid.ctl.client`'s.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Sequence
from typing import Any

from dbus_fast import BusType, DBusError

from ..dbus.wire import SafeMessageBus
from .client import (
    EXIT_FAILED,
    EXIT_USAGE,
    Client,
    CtlError,
    close,
    connect_over_ssh,
    exit_code_of,
)
from .commands import (
    VERBS,
    cmd_bench,
    cmd_clear_failures,
    cmd_devices,
    cmd_plan,
    cmd_presets,
    cmd_reload,
    cmd_show,
    cmd_stats,
    cmd_status,
    cmd_top,
    cmd_verb,
)
from .keys import add_parsers as keys_parsers
from .keys import cmd_keys
from .pull import add_parsers as pull_parsers
from .replicas import add_parsers as replica_parsers

EDIT_VERBS = ("new", "set", "unset", "rm", "mv", "cat", "edit")


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="lokictl", description="Control lokid over D-Bus.",
        epilog="exit status: 0 ok, 1 failed, 2 usage or invalid preset, 3 permission "
        "denied, 4 not found")
    p.add_argument("--bus", choices=("system", "session"), default="system")
    p.add_argument("--address", help="a D-Bus address to use instead of --bus")
    p.add_argument("-H", "--host", metavar="[USER@]HOST[:PORT]",
                   help="lokid on another machine, over ssh (as busctl -H)")
    p.add_argument("--hosts", metavar="HOST,HOST…",
                   help="presets and top across hosts in one table, each over ssh "
                   "as --host ('.': this host)")
    sub = p.add_subparsers(dest="command", required=True)
    for name, helptext in (("status", "the daemon and its presets"),
                           ("presets", "every preset, one line each"),
                           ("devices", "each device's memory: total, lokid's engines, "
                            "others, reserved, free")):
        s = sub.add_parser(name, help=helptext)
        s.add_argument("--json", action="store_true")
    for name, helptext in (("show", "a preset's settings, plan and state"),
                           ("plan", "the command line the preset's next start runs")):
        s = sub.add_parser(name, help=helptext)
        s.add_argument("preset")
        s.add_argument("--json", action="store_true")
    for name, helptext in (("start", "start the preset's engine"),
                           ("stop", "stop the preset's engine"),
                           ("restart", "restart the preset's engine")):
        s = sub.add_parser(name, help=helptext)
        s.add_argument("preset")
        s.add_argument("--wait", action="store_true",
                       help="wait until the engine is ready (stopped, for stop)")
        s.add_argument("--timeout", type=float, metavar="SECONDS",
                       help="with --wait: give up waiting after this long (exit 1)")
    s = sub.add_parser("unload", help="stop the preset's engine once its requests in flight "
                       "have finished (at most its serve.drain); says what it waited for")
    s.add_argument("preset")
    s.add_argument("--timeout", type=float, metavar="SECONDS",
                   help="give up waiting after this long (exit 1; the unload goes on)")
    s.set_defaults(wait=True)
    s = sub.add_parser("top", help="every preset's engine live: requests, speeds, memory "
                       "(q quits)")
    s.add_argument("--once", action="store_true", help="print the table once")
    s.add_argument("--json", action="store_true", help="print the rows once, as JSON")
    s = sub.add_parser("stats", help="a preset's request figures (its current start, or the "
                       "journal's window with --since)")
    s.add_argument("preset")
    s.add_argument("--since", metavar="TIME", help="recompute from the engine's journal since "
                   "TIME (as journalctl --since: \"10min ago\", \"10min\", \"today\", "
                   "\"2026-12-01 10:00\")")
    s.add_argument("--json", action="store_true")
    s = sub.add_parser("logs", help="a preset's engine log (its unit's journal, read by the "
                       "daemon)")
    s.add_argument("preset")
    s.add_argument("-n", "--lines", type=int, default=50, metavar="N",
                   help="the last N entries (1 to 10000; default 50)")
    s.add_argument("-f", "--follow", action="store_true", help="then follow, until Ctrl-C")
    s = sub.add_parser("usage", help="who used what: requests, refusals, tokens, wait and "
                       "engine time by key, preset or day (the gateway's counts, UTC days)")
    s.add_argument("--by", default="key", metavar="key|preset|day",
                   help="group by these, comma-separated (default key)")
    s.add_argument("--key", metavar="NAME", help="this key only")
    s.add_argument("--preset", metavar="NAME", help="this preset only")
    s.add_argument("--since", metavar="DAY", help="from this UTC day: YYYY-MM-DD, today, or "
                   "Nd (the last N days, today included); default every day kept")
    s.add_argument("--until", metavar="DAY", help="up to this UTC day (included)")
    s.add_argument("--json", action="store_true")
    sub.add_parser("reload", help="read the presets again (after editing them)")
    s = sub.add_parser("clear-failures", help="forget the recorded failures of automatic "
                       "speculative decoding for a preset")
    s.add_argument("preset")
    s = sub.add_parser("bench", help="benchmark the preset's running engine")
    s.add_argument("preset")
    s.add_argument("--full", action="store_true", help="add the depth phase")
    s.add_argument("--predict", type=int, default=0, help="tokens generated by the short line "
                   "(default 300)")
    s.add_argument("--prompt", type=int, default=0, help="prompt tokens of the short line "
                   "(default 2000)")
    s.add_argument("--repeat", type=int, default=1, metavar="N", help="measure N times after "
                   "one warm-up: each figure's median and spread (1 to 20, default 1)")
    s.add_argument("--json", action="store_true")
    _edit_parsers(sub)
    keys_parsers(sub)
    replica_parsers(sub)
    pull_parsers(sub)
    return p


def _edit_parsers(sub: Any) -> None:
    """The verbs that edit preset files through the daemon (:mod:`lokid.ctl.edit`)."""
    s = sub.add_parser("new", help="create a preset (the daemon checks it before writing)")
    s.add_argument("preset")
    s.add_argument("--model", help="a model name found in model_dirs, or an absolute path "
                   "(none for an external API: kind=external url=URL)")
    s.add_argument("values", nargs="*", metavar="KEY=VALUE",
                   help="more settings, such as ctx=32768 spec.mode=auto")
    s = sub.add_parser("set", help="set keys of a preset (KEY=VALUE, dotted: spec.mode=mtp)")
    s.add_argument("preset")
    s.add_argument("values", nargs="+", metavar="KEY=VALUE")
    s = sub.add_parser("unset", help="remove keys from a preset")
    s.add_argument("preset")
    s.add_argument("keys", nargs="+", metavar="KEY")
    s = sub.add_parser("rm", help="delete a preset")
    s.add_argument("preset")
    s.add_argument("--force", action="store_true", help="stop its engine first; delete it "
                   "even when another preset uses its model as draft")
    s = sub.add_parser("mv", help="rename a preset")
    s.add_argument("preset")
    s.add_argument("new_name", metavar="NEW")
    s.add_argument("--force", action="store_true", help="stop its engine first; rename it "
                   "even when another preset uses its model as draft")
    s = sub.add_parser("cat", help="print a preset's file")
    s.add_argument("preset")
    s = sub.add_parser("edit", help="edit a preset's file in $VISUAL or $EDITOR, checked "
                       "before it is saved")
    s.add_argument("preset")


async def _edit_command(c: Client, args: argparse.Namespace) -> int:
    import os

    from . import edit as ctledit

    command, name = str(args.command), str(args.preset)
    if command == "new":
        return await ctledit.cmd_new(c, name, args.model, [str(v) for v in args.values])
    if command == "set":
        return await ctledit.cmd_set(c, name, [str(v) for v in args.values])
    if command == "unset":
        return await ctledit.cmd_unset(c, name, [str(k) for k in args.keys])
    if command == "rm":
        return await ctledit.cmd_rm(c, name, bool(args.force))
    if command == "mv":
        return await ctledit.cmd_mv(c, name, str(args.new_name), bool(args.force))
    if command == "cat":
        return await ctledit.cmd_cat(c, name)
    return await ctledit.cmd_edit(c, name, os.environ)


async def _main(args: argparse.Namespace) -> int:
    bus_type = BusType.SESSION if args.bus == "session" else BusType.SYSTEM
    if args.hosts:
        from .fleet import FLEET_COMMANDS, cmd_fleet, hosts_of

        if args.host or args.command not in FLEET_COMMANDS:
            raise CtlError(f"--hosts: for {' and '.join(FLEET_COMMANDS)} only, without "
                           "--host", EXIT_USAGE)
        return await cmd_fleet(hosts_of(str(args.hosts)), str(args.command),
                               bool(args.json), bus_type, args.address)
    ssh = None
    if args.host:
        bus, ssh = await connect_over_ssh(str(args.host))
    else:
        try:
            bus = await SafeMessageBus(bus_address=args.address, bus_type=bus_type).connect()
        except (OSError, ValueError) as e:
            raise CtlError(f"cannot connect to the {args.bus} bus: {e}", EXIT_FAILED) from None
    client = Client(bus)
    try:
        command: str = args.command
        if command in EDIT_VERBS:
            return await _edit_command(client, args)
        if command == "keys":
            return await cmd_keys(client, args)
        if command in ("pull", "pulls"):
            from .pull import cmd_pull, cmd_pulls

            return await (cmd_pull(client, args) if command == "pull"
                          else cmd_pulls(client, bool(args.json)))
        if command == "replica":
            from .replicas import cmd_replica

            return await cmd_replica(client, args)
        if command in VERBS:
            timeout = None if args.timeout is None else float(args.timeout)
            return await cmd_verb(client, command, str(args.preset), bool(args.wait), timeout)
        if command == "clear-failures":
            return await cmd_clear_failures(client, str(args.preset))
        if command == "reload":
            return await cmd_reload(client)
        if command == "bench":
            from ..core.bench.repeat import MAX_REPEAT, repeat_error
            from ..core.bench.rules import MAX_TOKENS

            if not (0 <= args.predict <= MAX_TOKENS and 0 <= args.prompt <= MAX_TOKENS):
                raise CtlError(f"--predict and --prompt: 0 to {MAX_TOKENS}", EXIT_USAGE)
            if repeat_error(args.repeat):
                raise CtlError(f"--repeat: 1 to {MAX_REPEAT}", EXIT_USAGE)
            return await cmd_bench(client, str(args.preset), bool(args.full),
                                   int(args.predict), int(args.prompt), bool(args.json),
                                   int(args.repeat))
        if command == "logs":
            from . import logs as ctllogs

            if not 0 < args.lines <= ctllogs.MAX_LINES:
                raise CtlError(f"-n: 1 to {ctllogs.MAX_LINES}", EXIT_USAGE)
            return await ctllogs.cmd_logs(client, str(args.preset), int(args.lines),
                                          bool(args.follow))
        if command == "usage":
            from .usage import cmd_usage

            return await cmd_usage(client, str(args.by), args.key, args.preset, args.since,
                                   args.until, bool(args.json))
        as_json = bool(args.json)
        if command == "top":
            return await cmd_top(client, bool(args.once), as_json)
        if command == "stats":
            return await cmd_stats(client, str(args.preset), args.since, as_json)
        if command == "status":
            return await cmd_status(client, as_json)
        if command == "presets":
            return await cmd_presets(client, as_json)
        if command == "devices":
            return await cmd_devices(client, as_json)
        if command == "show":
            return await cmd_show(client, str(args.preset), as_json)
        return await cmd_plan(client, str(args.preset), as_json)
    except DBusError as e:
        if e.type == "org.freedesktop.DBus.Error.ServiceUnknown":
            raise CtlError("lokid is not running (and cannot be activated on this bus)",
                           EXIT_FAILED) from None
        raise CtlError(e.text, exit_code_of(e)) from None
    finally:
        await close(bus, ssh)


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = _parser()
    args, extra = p.parse_known_args(argv)
    # `new PRESET --model M KEY=VALUE…`: argparse matched PRESET and an empty KEY=VALUE list
    # together, before --model; what follows --model is left over, and is that list.
    if extra and args.command == "new" and not any(e.startswith("-") for e in extra):
        args.values += extra
    elif extra:
        p.error("unrecognized arguments: " + " ".join(extra))
    if args.command == "new" and args.model is None and "kind=external" not in args.values:
        p.error("new: --model is required (or kind=external url=URL for an API elsewhere)")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        return asyncio.run(_main(args))
    except CtlError as e:
        print(f"lokictl: {e}", file=sys.stderr)
        return e.code
    except KeyboardInterrupt:
        return 130

