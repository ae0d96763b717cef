"""``lokictl``: the operator's client of ``org.lokid.Lokid1`` (a thin D-Bus client).

Read commands: ``status``, ``presets``, ``show <preset>``, ``plan <preset>``, each
with ``--json``; ``top`` and ``stats <preset> [--since TIME]`` (:mod:`lokid.ctlstats`);
``logs <preset> [-n N] [-f]`` (:mod:`lokid.ctllogs`: the daemon reads the journal).
``bench <preset> [--full]`` runs the benchmark through the daemon
with a progress bar (``BenchProgress``) and prints the report. Verbs:
``start|stop|restart <preset> [--wait]`` (``--wait`` follows
``EngineStateChanged`` until the engine is ready or stopped, with a spinner
showing the engine's STATUS text on a terminal), ``reload`` and ``clear-failures <preset>``.
Editing presets through the daemon: ``new``, ``set``, ``unset``, ``rm``, ``mv``, ``cat``
and ``edit`` (:mod:`lokid.ctledit`).

``--host [USER@]HOST[:PORT]`` reaches lokid on another machine the way
``busctl -H`` does: ``ssh -xT HOST systemd-stdio-bridge`` carries the system
bus (``$SYSTEMD_SSH`` names another ssh, as for systemd's tools). dbus-fast
knows no ``unixexec:`` address, so lokictl listens on a private socket and
hands the connection it accepts to ssh as its stdin and stdout.

Exit status: 0 ok, 1 failed (daemon unreachable, engine failed), 2 usage or
invalid preset, 3 permission denied, 4 not found.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shlex
import shutil
import sys
from collections.abc import Sequence
from typing import Any

from dbus_fast import BusType, DBusError
from dbus_fast.aio import MessageBus

from .core import errors
from .core.names import (
    BUS_NAME,
    MANAGER_INTERFACE,
    OBJECT_PATH,
    PRESET_INTERFACE,
    preset_of_object_path,
)
from .core.wording import counted
from .dbus.wire import SafeMessageBus
from .engine.buscall import call, plain

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_PERMISSION, EXIT_NOT_FOUND = 0, 1, 2, 3, 4
PRESET_PROPERTIES = ("Name", "State", "Status", "Model", "Unit", "SpecMode", "SpecActive",
                     "AutoSpecBlocked", "Argv", "RunningArgv", "PendingRestart", "Notes",
                     "LastBench", "Stats")
VERBS = {"start": "StartPreset", "stop": "StopPreset", "restart": "RestartPreset"}
EDIT_VERBS = ("new", "set", "unset", "rm", "mv", "cat", "edit")
SPINNER = "|/-\\"


class CtlError(Exception):
    def __init__(self, message: str, code: int):
        super().__init__(message)
        self.code = code


def exit_code_of(error: DBusError) -> int:
    name = error.type or ""
    if name in (errors.NOT_FOUND, "org.freedesktop.DBus.Error.UnknownObject"):
        return EXIT_NOT_FOUND
    if name in (errors.PERMISSION_DENIED, "org.freedesktop.DBus.Error.AccessDenied"):
        return EXIT_PERMISSION
    if name in (errors.INVALID_PRESET, errors.INVALID_ARGS):
        return EXIT_USAGE
    return EXIT_FAILED


class Client:
    def __init__(self, bus: MessageBus):
        self.bus = bus

    async def _call(self, path: str, interface: str, member: str, signature: str = "",
                    body: Sequence[Any] = ()) -> list[Any]:
        return await call(self.bus, BUS_NAME, path, interface, member, signature, body)

    async def properties(self, path: str, interface: str) -> dict[str, Any]:
        (props,) = await self._call(path, "org.freedesktop.DBus.Properties", "GetAll", "s",
                                    [interface])
        return {k: plain(v) for k, v in props.items()}

    async def add_match(self, rule: str) -> None:
        await call(self.bus, "org.freedesktop.DBus", "/org/freedesktop/DBus",
                   "org.freedesktop.DBus", "AddMatch", "s", [rule])

    async def manager(self, member: str, signature: str = "",
                      body: Sequence[Any] = ()) -> list[Any]:
        return await self._call(OBJECT_PATH, MANAGER_INTERFACE, member, signature, body)

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
            "active": list(props.get("ActivePresets", [])),
            "broken": props.get("BrokenPresets", {})}
    if as_json:
        _print_json(data)
        return EXIT_OK
    print(f"lokid {data['version']}: {counted(len(data['presets']), 'preset')}"
          + (f", {len(data['active'])} running ({', '.join(data['active'])})"
             if data["active"] else "")
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
    """Every preset, the broken ones too: a file that does not parse (no object) and a
    preset whose next start cannot be planned (BrokenPresets has both): state "broken"
    unless its engine runs, and the error."""
    rows = await _preset_rows(c)
    props = await c.properties(OBJECT_PATH, MANAGER_INTERFACE)
    broken = dict(props.get("BrokenPresets", {}))
    for r in rows:
        if r["Name"] in broken:
            r["Error"] = broken.pop(r["Name"])
            if r["State"] in ("inactive", "failed"):
                r["State"] = "broken"
    if as_json:
        _print_json(rows + [{"Name": name, "State": "broken", "Error": error}
                            for name, error in sorted(broken.items())])
        return EXIT_OK
    from . import ctlstats

    lines = [["PRESET", "STATE", "SPEC", "URL", "UP", "GPU MEM", "MODEL"]]
    for r in rows:
        top = ctlstats.row(r)   # what is live only (URL, uptime, memory) is "-" otherwise
        blocked = "  (auto cut: " + r["AutoSpecBlocked"] + ")" if r["AutoSpecBlocked"] else ""
        error = "  (broken: " + r["Error"] + ")" if r.get("Error") else ""
        lines.append([r["Name"], r["State"], r["SpecMode"], top["url"] or "-",
                      ctlstats.duration(top["uptime_seconds"]), ctlstats.gpu_text(top),
                      f"{r['Model']}{blocked}{error}"])
    lines += [[name, "broken", "-", "-", "-", "-", error] for name, error in sorted(broken.items())]
    print(ctlstats.columns(lines))
    return EXIT_OK


async def cmd_stats(c: Client, name: str, since: str | None, as_json: bool) -> int:
    """One preset's figures: the daemon's (its current start), or, with ``since``, the
    engine's journal over that window (every start in it)."""
    from . import ctllogs, ctlstats

    # a time journalctl would not take is a usage error before any call
    at = None if since is None else ctllogs.since_or_usage(
        since, lambda text: CtlError(text, EXIT_USAGE))
    props = await c.properties(await c.preset_path(name), PRESET_INTERFACE)
    if at is None:
        stats = dict(props.get("Stats") or {})
    else:
        manager = await c.properties(OBJECT_PATH, MANAGER_INTERFACE)
        if manager.get("Runner") != "systemd":
            raise CtlError("--since reads the engine's journal, and engines run as the "
                           "daemon's children here (no journal): `lokictl stats "
                           f"{name}` shows the current start", EXIT_USAGE)
        # the daemon reads the journal: group loki may not (journalctl says so)
        stats = await ctllogs.stats_since(c, name, at)
    if as_json:
        _print_json(stats)
    else:
        print(ctlstats.stats_text(name, stats, since))
    return EXIT_OK


async def cmd_top(c: Client, once: bool, as_json: bool) -> int:
    """Every preset's line, refreshed each second until q or Ctrl-C (once: printed once)."""
    import time

    from . import ctlstats

    async def rows() -> list[dict[str, Any]]:
        return [ctlstats.row(r) for r in await _preset_rows(c)]

    if as_json:
        _print_json(await rows())
        return EXIT_OK
    if once or not sys.stdout.isatty():
        print(ctlstats.table(await rows()))
        return EXIT_OK
    quit_ = asyncio.Event()
    restore = _keys(quit_)
    try:
        while not quit_.is_set():
            width = shutil.get_terminal_size().columns
            text = ctlstats.table(await rows(), width)
            ctlstats.write("\x1b[H\x1b[2J" + f"lokid top  {time.strftime('%H:%M:%S')}  "
                           "(q quits)\n\n" + text + "\n")
            try:
                await asyncio.wait_for(quit_.wait(), 1.0)
            except TimeoutError:
                pass
    finally:
        restore()
    return EXIT_OK


def _keys(quit_: asyncio.Event) -> Any:
    """Read single keys from a terminal (q quits); the function that restores it."""
    import termios
    import tty

    if not sys.stdin.isatty():
        return lambda: None
    fd = sys.stdin.fileno()
    saved = termios.tcgetattr(fd)
    tty.setcbreak(fd)
    loop = asyncio.get_running_loop()

    def key() -> None:
        if sys.stdin.read(1) in ("q", "Q"):
            quit_.set()

    loop.add_reader(fd, key)

    def restore() -> None:
        loop.remove_reader(fd)
        termios.tcsetattr(fd, termios.TCSADRAIN, saved)
    return restore


async def cmd_show(c: Client, name: str, as_json: bool) -> int:
    props = await c.properties(await c.preset_path(name), PRESET_INTERFACE)
    row: dict[str, Any] = {k: props.get(k) for k in PRESET_PROPERTIES}
    if as_json:
        _print_json(row)
        return EXIT_OK
    for key in ("Name", "State", "Status", "Model", "Unit", "SpecMode"):
        print(f"{key}: {row[key]}")
    print("SpecActive: " + (", ".join(row["SpecActive"]) or "none"))
    if row["AutoSpecBlocked"]:
        print(f"AutoSpecBlocked: {row['AutoSpecBlocked']}")
    bench = row.get("LastBench") or {}
    if bench.get("result"):
        r = bench["result"]
        print(f"LastBench: {r.get('mode')} prefill {r.get('prompt_per_second', 0):.1f} tok/s, "
              f"decode {r.get('predicted_per_second', 0):.1f} tok/s (engine "
              f"{bench.get('engine') or 'n/a'})")
    # the command line that runs and the one the next start runs: they differ after an
    # edit until a restart (PendingRestart)
    running = row.get("RunningArgv") or []
    print("Running: " + (shlex.join(running) if running else "-"))
    print("Next start: " + (shlex.join(row["Argv"]) if row["Argv"] else "-"))
    print("PendingRestart: " + ("yes (a restart applies the edit)" if row.get("PendingRestart")
                                else "no"))
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


class Spinner:
    """One line on a terminal: a turning bar and the engine's state and STATUS text."""

    def __init__(self, enabled: bool):
        self.enabled = enabled
        self.text = ""
        self.turn = 0

    def show(self, text: str | None = None) -> None:
        if text is not None:
            self.text = text
        if self.enabled:
            self.turn += 1
            width = shutil.get_terminal_size().columns - 3
            sys.stderr.write(f"\r\033[K{SPINNER[self.turn % 4]} {self.text[:width]}")
            sys.stderr.flush()

    def clear(self) -> None:
        if self.enabled:
            sys.stderr.write("\r\033[K")
            sys.stderr.flush()


def _next_step(name: str, verb: str, result: str) -> str:
    """What to run after a job ended badly."""
    if result == "canceled":
        return "another start, stop or restart replaced it"
    return (f"see `lokictl logs {name} -n 30`; `lokictl start {name}` tries again once the "
            "cause is fixed")


async def cmd_verb(c: Client, verb: str, name: str, wait: bool, timeout: float | None) -> int:
    """start/stop/restart; with ``wait``, follow the verb's job until it ends.

    The daemon returns the job's id and ends it with ``JobFinished``: the
    states on the way (a restart passes through stopping and inactive) are not
    its outcome.
    """
    from dbus_fast import Message, MessageType

    path = await c.preset_path(name)
    ended: dict[str, tuple[str, str, str]] = {}    # job → (result, state, detail)
    arrived = asyncio.Event()
    spinner = Spinner(wait and sys.stderr.isatty())

    def on_message(msg: Message) -> bool:
        if msg.message_type != MessageType.SIGNAL:
            return False
        if msg.member == "JobFinished" and msg.path == OBJECT_PATH and msg.body[0] == name:
            _, job, _verb, result, state, detail = msg.body
            ended[str(job)] = (str(result), str(state), str(detail))
            arrived.set()
        elif msg.member == "EngineStateChanged" and msg.path == OBJECT_PATH \
                and msg.body[0] == name:
            spinner.show(f"{msg.body[1]}" + (f": {msg.body[2]}" if msg.body[2] else ""))
        elif msg.member == "PropertiesChanged" and msg.path == path:
            status = msg.body[1].get("Status")
            if status is not None and status.value:
                spinner.show(str(status.value))
        return False

    if wait:
        rules = [f"type='signal',sender='{BUS_NAME}',path='{OBJECT_PATH}',"
                 f"interface='{MANAGER_INTERFACE}',member='{member}',arg0='{name}'"
                 for member in ("JobFinished", "EngineStateChanged")]
        rules.append(f"type='signal',sender='{BUS_NAME}',path='{path}',"
                     "interface='org.freedesktop.DBus.Properties',member='PropertiesChanged'")
        for rule in rules:
            await c.add_match(rule)
        c.bus.add_message_handler(on_message)
    (job,) = await c._call(OBJECT_PATH, MANAGER_INTERFACE, VERBS[verb], "s", [name])
    if not wait:
        return EXIT_OK
    target = "stopped" if verb == "stop" else "ready"
    loop = asyncio.get_running_loop()
    deadline = None if timeout is None else loop.time() + timeout
    while job not in ended:
        left = None if deadline is None else deadline - loop.time()
        if left is not None and left <= 0:
            spinner.clear()
            print(f"lokictl: {name}: not {target} after {timeout:g} s; the {verb} job goes "
                  f"on (`lokictl stop {name}` cancels it)", file=sys.stderr)
            return EXIT_FAILED
        arrived.clear()
        try:
            await asyncio.wait_for(arrived.wait(), min(left or 0.1, 0.1))
        except TimeoutError:
            spinner.show()
    spinner.clear()
    result, state, detail = ended[job]
    if result == "done" and (verb == "stop" or state == "ready"):
        print(f"{name}: {state}" + (f" ({detail})" if detail else ""))
        return EXIT_OK
    what = f"{verb} {result}" if result != "done" else f"{verb} done, but the engine is {state}"
    print(f"lokictl: {name}: {what}" + (f": {detail}" if detail else "")
          + f"\n  {_next_step(name, verb, result)}", file=sys.stderr)
    return EXIT_FAILED


def _bar(phase: str, step: int, steps: int, width: int = 20) -> str:
    done = width * step // max(steps, 1)
    return f"[{'#' * done}{' ' * (width - done)}] {step}/{steps} {phase}"


async def cmd_bench(c: Client, name: str, full: bool, predict: int, prompt: int,
                    as_json: bool) -> int:
    """Benchmark the preset's ready engine; progress from BenchProgress, then the report."""
    from dbus_fast import Message, MessageType

    from .core import benchrules

    await c.preset_path(name)  # NotFound before anything runs
    tty = sys.stderr.isatty()

    def on_message(msg: Message) -> bool:
        if (msg.message_type == MessageType.SIGNAL and msg.member == "BenchProgress"
                and msg.path == OBJECT_PATH and msg.body[0] == name):
            _, phase, step, steps = msg.body
            if tty:
                sys.stderr.write("\r\033[K" + _bar(str(phase), int(step), int(steps)))
            else:
                sys.stderr.write(f"  [{step}/{steps}] {phase}\n")
            sys.stderr.flush()
        return False

    if not as_json:
        await c.add_match(f"type='signal',sender='{BUS_NAME}',path='{OBJECT_PATH}',"
                          f"interface='{MANAGER_INTERFACE}',member='BenchProgress',"
                          f"arg0='{name}'")
        c.bus.add_message_handler(on_message)
    mode = benchrules.FULL if full else benchrules.QUICK
    try:
        (outcome,) = await c._call(OBJECT_PATH, MANAGER_INTERFACE, "Bench", "ssuu",
                                   [name, mode, predict, prompt])
    finally:
        if tty and not as_json:
            sys.stderr.write("\r\033[K")
    data = plain(outcome)
    if as_json:
        _print_json(data)
        return EXIT_OK
    result = benchrules.result_from_json(data["result"])
    print(f"{name}: {mode} benchmark at {data.get('url', '')}")
    print("\n".join(benchrules.report(result, str(data.get("not_saved_reason", "")))))
    return EXIT_OK


async def cmd_reload(c: Client) -> int:
    """Manager.Reload: the presets read again (and, under systemd, its drop-ins)."""
    await c._call(OBJECT_PATH, MANAGER_INTERFACE, "Reload")
    props = await c.properties(OBJECT_PATH, MANAGER_INTERFACE)
    broken = props["BrokenPresets"]
    # One line per preset that cannot start, its name then its error: the count on the
    # first line says what they are ("NAME: broken: …" read "broken: broken: …" for
    # a preset named so).
    print(f"presets read again: {counted(len(props['Presets']), 'preset')}"
          + (f", {len(broken)} broken:" if broken else ""))
    for name, error in sorted(broken.items()):
        print(f"  {name}: {error}")
    return EXIT_OK


async def cmd_clear_failures(c: Client, name: str) -> int:
    (count,) = await c._call(await c.preset_path(name), PRESET_INTERFACE, "ClearFailures")
    print(f"{name}: {count} recorded failure{'s' if count != 1 else ''} of automatic "
          "speculation forgotten")
    return EXIT_OK


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="lokictl", description="Control lokid over D-Bus.",
        epilog="exit status: 0 ok, 1 failed, 2 usage or invalid preset, 3 permission "
        "denied, 4 not found")
    p.add_argument("--bus", choices=("system", "session"), default="system")
    p.add_argument("--address", help="a D-Bus address to use instead of --bus")
    p.add_argument("-H", "--host", metavar="[USER@]HOST[:PORT]",
                   help="lokid on another machine, over ssh (as busctl -H)")
    sub = p.add_subparsers(dest="command", required=True)
    for name, helptext in (("status", "the daemon and its presets"),
                           ("presets", "every preset, one line each")):
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
    s.add_argument("--json", action="store_true")
    _edit_parsers(sub)
    return p


def _edit_parsers(sub: Any) -> None:
    """The verbs that edit preset files through the daemon (:mod:`lokid.ctledit`)."""
    s = sub.add_parser("new", help="create a preset (the daemon checks it before writing)")
    s.add_argument("preset")
    s.add_argument("--model", required=True, help="a model name found in model_dirs, or an "
                   "absolute path")
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

    from . import ctledit

    command, name = str(args.command), str(args.preset)
    if command == "new":
        return await ctledit.cmd_new(c, name, str(args.model), [str(v) for v in args.values])
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


def ssh_argv(host: str) -> list[str]:
    """What busctl -H runs: ssh -xT [-p PORT] -- [USER@]HOST systemd-stdio-bridge."""
    import os

    ssh = os.environ.get("SYSTEMD_SSH") or "ssh"
    target, port = host, ""
    if host.count(":") == 1:  # HOST:PORT (an IPv6 address has several)
        target, port = host.split(":")
    if not target or target.startswith("-"):
        raise CtlError(f"--host {host!r}: not a host name", EXIT_USAGE)
    return [ssh, "-xT", *(["-p", port] if port else []), "--", target,
            "systemd-stdio-bridge"]


async def connect_over_ssh(host: str) -> tuple[MessageBus, asyncio.subprocess.Process]:
    """A bus connection through ssh: a private socket whose one connection ssh carries."""
    import os
    import socket
    import tempfile

    argv = ssh_argv(host)
    loop = asyncio.get_running_loop()
    with tempfile.TemporaryDirectory(prefix="lokictl-") as tmp:
        path = os.path.join(tmp, "bus")
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            listener.bind(path)
            listener.listen(1)
            listener.setblocking(False)
            connecting = asyncio.ensure_future(SafeMessageBus(bus_address=f"unix:path={path}")
                                               .connect())
            conn, _ = await loop.sock_accept(listener)
        finally:
            listener.close()
        with conn:
            conn.setblocking(True)
            try:
                ssh = await asyncio.create_subprocess_exec(*argv, stdin=conn.fileno(),
                                                           stdout=conn.fileno())
            except OSError as e:
                connecting.cancel()
                raise CtlError(f"cannot run {argv[0]}: {e.strerror}", EXIT_FAILED) from None
        try:
            return await connecting, ssh
        except (OSError, EOFError, ValueError) as e:
            raise CtlError(f"cannot reach lokid on {host} over ssh: {e or 'connection closed'}",
                           EXIT_FAILED) from None


async def _main(args: argparse.Namespace) -> int:
    bus_type = BusType.SESSION if args.bus == "session" else BusType.SYSTEM
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
        if command in VERBS:
            timeout = None if args.timeout is None else float(args.timeout)
            return await cmd_verb(client, command, str(args.preset), bool(args.wait), timeout)
        if command == "clear-failures":
            return await cmd_clear_failures(client, str(args.preset))
        if command == "reload":
            return await cmd_reload(client)
        if command == "bench":
            from .core.benchrules import MAX_TOKENS

            if not (0 <= args.predict <= MAX_TOKENS and 0 <= args.prompt <= MAX_TOKENS):
                raise CtlError(f"--predict and --prompt: 0 to {MAX_TOKENS}", EXIT_USAGE)
            return await cmd_bench(client, str(args.preset), bool(args.full),
                                   int(args.predict), int(args.prompt), bool(args.json))
        if command == "logs":
            from . import ctllogs

            if not 0 < args.lines <= ctllogs.MAX_LINES:
                raise CtlError(f"-n: 1 to {ctllogs.MAX_LINES}", EXIT_USAGE)
            return await ctllogs.cmd_logs(client, str(args.preset), int(args.lines),
                                          bool(args.follow))
        as_json = bool(args.json)
        if command == "top":
            return await cmd_top(client, bool(args.once), as_json)
        if command == "stats":
            return await cmd_stats(client, str(args.preset), args.since, as_json)
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
        if ssh is not None:
            try:
                await asyncio.wait_for(ssh.wait(), 5)
            except TimeoutError:
                ssh.kill()


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = _parser()
    args, extra = p.parse_known_args(argv)
    # `new PRESET --model M KEY=VALUE…`: argparse matched PRESET and an empty KEY=VALUE list
    # together, before --model; what follows --model is left over, and is that list.
    if extra and args.command == "new" and not any(e.startswith("-") for e in extra):
        args.values += extra
    elif extra:
        p.error("unrecognized arguments: " + " ".join(extra))
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


if __name__ == "__main__":
    # `python -m lokid.ctl` runs this file as __main__, and lokid.ctledit imports lokid.ctl:
    # run that one module's main, whose `except CtlError` catches what ctledit raises (the
    # CtlError of this copy is another class).
    from lokid.ctl import main as module_main

    sys.exit(module_main())
