"""``lokictl``: the operator's client of ``org.lokid.Lokid1`` (a thin D-Bus client).

Read commands so far: ``status``, ``presets``, ``show <preset>``, ``plan <preset>``,
each with ``--json``. The verbs (start, stop, restart, clear-failures) come with
the daemon's runners and authorisation.

Exit status: 0 ok, 1 failed (daemon unreachable, engine failed), 2 usage or
invalid preset, 3 permission denied, 4 not found.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shlex
import sys
from collections.abc import Sequence
from typing import Any

from dbus_fast import BusType, DBusError, Variant
from dbus_fast.aio import MessageBus

from .names import (
    BUS_NAME,
    ERROR_PREFIX,
    MANAGER_INTERFACE,
    OBJECT_PATH,
    PRESET_INTERFACE,
    preset_of_object_path,
)

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_PERMISSION, EXIT_NOT_FOUND = 0, 1, 2, 3, 4
PRESET_PROPERTIES = ("Name", "Model", "Unit", "SpecMode", "AutoSpecBlocked", "Argv", "Notes")


class CtlError(Exception):
    def __init__(self, message: str, code: int):
        super().__init__(message)
        self.code = code


def exit_code_of(error: DBusError) -> int:
    name = error.type or ""
    if name in (ERROR_PREFIX + "NotFound", "org.freedesktop.DBus.Error.UnknownObject"):
        return EXIT_NOT_FOUND
    if name in (ERROR_PREFIX + "PermissionDenied", "org.freedesktop.DBus.Error.AccessDenied"):
        return EXIT_PERMISSION
    if name == ERROR_PREFIX + "InvalidPreset":
        return EXIT_USAGE
    return EXIT_FAILED


def plain(value: Any) -> Any:
    """dbus-fast Variants, recursively, as plain Python values (for JSON)."""
    if isinstance(value, Variant):
        return plain(value.value)
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [plain(v) for v in value]
    return value


class Client:
    def __init__(self, bus: MessageBus):
        self.bus = bus

    async def _call(self, path: str, interface: str, member: str, signature: str = "",
                    body: Sequence[Any] = ()) -> list[Any]:
        from dbus_fast import Message, MessageType

        reply = await self.bus.call(Message(destination=BUS_NAME, path=path,
                                            interface=interface, member=member,
                                            signature=signature, body=list(body)))
        if reply is None:
            raise CtlError("no reply from lokid", EXIT_FAILED)
        if reply.message_type == MessageType.ERROR:
            name = reply.error_name or "org.freedesktop.DBus.Error.Failed"
            raise DBusError(name, str(reply.body[0] if reply.body else name))
        return list(reply.body)

    async def properties(self, path: str, interface: str) -> dict[str, Any]:
        (props,) = await self._call(path, "org.freedesktop.DBus.Properties", "GetAll", "s",
                                    [interface])
        return {k: plain(v) for k, v in props.items()}

    async def preset_path(self, name: str) -> str:
        (path,) = await self._call(OBJECT_PATH, MANAGER_INTERFACE, "GetPreset", "s", [name])
        return str(path)

    async def plan(self, name: str) -> dict[str, Any]:
        path = await self.preset_path(name)
        (plan,) = await self._call(path, PRESET_INTERFACE, "Plan")
        return dict(plain(plan))


def _print_json(data: Any) -> None:
    print(json.dumps(data, indent=2, ensure_ascii=False))


async def cmd_status(c: Client, as_json: bool) -> int:
    props = await c.properties(OBJECT_PATH, MANAGER_INTERFACE)
    data = {"version": props["Version"],
            "presets": [preset_of_object_path(p) for p in props["Presets"]],
            "broken": props.get("BrokenPresets", {})}
    if as_json:
        _print_json(data)
        return EXIT_OK
    print(f"lokid {data['version']}: {len(data['presets'])} presets"
          + (f", {len(data['broken'])} broken" if data["broken"] else ""))
    for name, error in sorted(data["broken"].items()):
        print(f"  broken {name}: {error}")
    return EXIT_OK


async def _preset_rows(c: Client) -> list[dict[str, Any]]:
    props = await c.properties(OBJECT_PATH, MANAGER_INTERFACE)
    rows = []
    for path in props["Presets"]:
        p = await c.properties(path, PRESET_INTERFACE)
        rows.append({k: p.get(k) for k in PRESET_PROPERTIES})
    return rows


async def cmd_presets(c: Client, as_json: bool) -> int:
    rows = await _preset_rows(c)
    if as_json:
        _print_json(rows)
        return EXIT_OK
    width = max([len(r["Name"]) for r in rows] + [6])
    print(f"{'PRESET':<{width}}  {'SPEC':<10}  MODEL")
    for r in rows:
        blocked = "  (auto cut: " + r["AutoSpecBlocked"] + ")" if r["AutoSpecBlocked"] else ""
        print(f"{r['Name']:<{width}}  {r['SpecMode']:<10}  {r['Model']}{blocked}")
    return EXIT_OK


async def cmd_show(c: Client, name: str, as_json: bool) -> int:
    props = await c.properties(await c.preset_path(name), PRESET_INTERFACE)
    row: dict[str, Any] = {k: props.get(k) for k in PRESET_PROPERTIES}
    if as_json:
        _print_json(row)
        return EXIT_OK
    for key in PRESET_PROPERTIES[:5]:
        print(f"{key}: {row[key]}")
    print("Argv: " + shlex.join(row["Argv"]))
    for note in row["Notes"]:
        print(f"  - {note}")
    return EXIT_OK


async def cmd_plan(c: Client, name: str, as_json: bool) -> int:
    plan = await c.plan(name)
    if as_json:
        _print_json(plan)
        return EXIT_OK
    for k, v in sorted(plan["env"].items()):
        print(f"{k}={shlex.quote(v)}")
    print(shlex.join(plan["argv"]))
    for note in plan["notes"]:
        print(f"  - {note}")
    return EXIT_OK


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="lokictl", description="Control lokid over D-Bus.")
    p.add_argument("--bus", choices=("system", "session"), default="system")
    p.add_argument("--address", help="a D-Bus address to use instead of --bus")
    sub = p.add_subparsers(dest="command", required=True)
    for name, helptext in (("status", "the daemon and its presets"),
                           ("presets", "every preset, one line each")):
        s = sub.add_parser(name, help=helptext)
        s.add_argument("--json", action="store_true")
    for name, helptext in (("show", "a preset's settings and plan"),
                           ("plan", "the command line the preset's next start runs")):
        s = sub.add_parser(name, help=helptext)
        s.add_argument("preset")
        s.add_argument("--json", action="store_true")
    return p


async def _main(args: argparse.Namespace) -> int:
    bus_type = BusType.SESSION if args.bus == "session" else BusType.SYSTEM
    try:
        bus = await MessageBus(bus_address=args.address, bus_type=bus_type).connect()
    except (OSError, ValueError) as e:
        raise CtlError(f"cannot connect to the {args.bus} bus: {e}", EXIT_FAILED) from None
    client = Client(bus)
    try:
        command: str = args.command
        as_json = bool(args.json)
        if command == "status":
            return await cmd_status(client, as_json)
        if command == "presets":
            return await cmd_presets(client, as_json)
        if command == "show":
            return await cmd_show(client, str(args.preset), as_json)
        return await cmd_plan(client, str(args.preset), as_json)
    except DBusError as e:
        if e.type == "org.freedesktop.DBus.Error.ServiceUnknown":
            raise CtlError("lokid is not running (and cannot be activated on this bus)",
                           EXIT_FAILED) from None
        raise CtlError(e.text, exit_code_of(e)) from None
    finally:
        bus.disconnect()


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        return asyncio.run(_main(args))
    except CtlError as e:
        print(f"lokictl: {e}", file=sys.stderr)
        return e.code
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
