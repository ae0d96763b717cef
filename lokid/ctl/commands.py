"""The commands of lokictl that read and act through the daemon.

Read commands: ``status``, ``presets``, ``show <preset>``, ``plan <preset>``, each
with ``--json``; ``top`` and ``stats <preset> [--since TIME]`` (formatted by
:mod:`lokid.ctl.stats`). ``bench <preset> [--full]`` runs the benchmark through the
daemon with a progress bar (``BenchProgress``) and prints the report. Verbs:
``start|stop|restart <preset> [--wait]`` (``--wait`` follows ``EngineStateChanged``
until the engine is ready or stopped, with a spinner showing the engine's STATUS text
on a terminal), ``reload`` and ``clear-failures <preset>``.
"""

from __future__ import annotations

import asyncio
import json
import shlex
import shutil
import sys
import time
from typing import Any

from dbus_fast import DBusError

from ..core.names import (
    BUS_NAME,
    MANAGER_INTERFACE,
    OBJECT_PATH,
    PRESET_INTERFACE,
    USAGE_INTERFACE,
    preset_of_object_path,
)
from ..core.wording import counted
from ..host.buscall import plain
from .client import (
    EXIT_FAILED,
    EXIT_NOT_FOUND,
    EXIT_OK,
    EXIT_USAGE,
    Client,
    CtlError,
    exit_code_of,
)

PRESET_PROPERTIES = ("Name", "State", "Status", "Model", "Unit", "SpecMode", "SpecActive",
                     "AutoSpecBlocked", "Argv", "RunningArgv", "PendingRestart", "Notes",
                     "LastBench", "Stats", "OnDemand", "IdleStop", "Group", "Drain", "Keep",
                     "IdleStopAt", "Kind", "Url", "UpstreamModel", "Reachable",
                     "OnDemandState", "LastRequestAt", "GroupHolder", "Memory", "Unloading",
                     "Replicas")
VERBS = {"start": "StartPreset", "stop": "StopPreset", "restart": "RestartPreset",
         "unload": "UnloadPreset"}
SPINNER = "|/-\\"


def idle_text(row: dict[str, Any], now: float) -> str:
    """When the engine stops for idleness, as a person reads it: "stops in 12min without
    a request" (IdleStopAt), "" when no stop is planned."""
    from ..core.serve.tables import span_text

    at = row.get("IdleStopAt") or 0.0
    if not at:
        return ""
    left = at - now
    if left < 1:
        return "stopping: no request for " + span_text(row.get("IdleStop") or 0.0)
    return f"stops in {span_text(left if left < 60 else round(left / 60) * 60)} without a request"


def serve_text(row: dict[str, Any]) -> str:
    """The [serve] settings, one line: "on demand, idle_stop 15min, group gpu0 (drain
    2min)", or "by hand"."""
    from ..core.serve.tables import span_text

    parts = ["on demand"] if row.get("OnDemand") else []
    if row.get("IdleStop"):
        parts.append(f"idle_stop {span_text(row['IdleStop'])}")
    if row.get("Group"):
        parts.append(f"group {row['Group']} (drain {span_text(row.get('Drain') or 0.0)})")
    return ", ".join(parts) or "by hand (no [serve] settings)"


def _print_json(data: Any) -> None:
    print(json.dumps(data, indent=2, ensure_ascii=False))


async def cmd_status(c: Client, as_json: bool) -> int:
    props = await c.properties(OBJECT_PATH, MANAGER_INTERFACE)
    data = {"version": props["Version"],
            "presets": [preset_of_object_path(p) for p in props["Presets"]],
            "active": list(props.get("ActivePresets", [])),
            "broken": props.get("BrokenPresets", {})}
    from .replicas import replica_lines, replica_rows

    data["replicas"] = await replica_rows(c, data["active"])   # several engines (issue 47)
    if as_json:
        _print_json(data)
        return EXIT_OK
    print(f"lokid {data['version']}: {counted(len(data['presets']), 'preset')}"
          + (f", {len(data['active'])} running ({', '.join(data['active'])})"
             if data["active"] else "")
          + (f", {len(data['broken'])} broken" if data["broken"] else ""))
    for name, error in sorted(data["broken"].items()):
        print(f"  broken {name}: {error}")
    for line in replica_lines(data["replicas"]):
        print(f"  {line}")
    return EXIT_OK


async def _preset_rows(c: Client) -> list[dict[str, Any]]:
    """Each listed preset object's properties. An object gone between the listing and its
    reading (the daemon replaced or removed it: a file edited or deleted just then) is
    left out: the listing was right when made, and the next one shows the new object."""
    props = await c.properties(OBJECT_PATH, MANAGER_INTERFACE)
    rows = []
    for path in props["Presets"]:
        try:
            p = await c.properties(path, PRESET_INTERFACE)
        except DBusError as e:
            if exit_code_of(e) == EXIT_NOT_FOUND:
                continue
            raise
        rows.append({k: p.get(k) for k in PRESET_PROPERTIES})
    return rows


async def shown_rows(c: Client) -> tuple[list[dict[str, Any]], dict[str, str]]:
    """Every preset object's properties, with the broken ones marked: a preset whose next
    start cannot be planned gets its ``Error`` and, unless its engine runs, the state
    "broken" (the bus's State is its engine's: inactive). Also the broken files that
    have no object (they do not parse): name → error. BrokenPresets has both."""
    rows = await _preset_rows(c)
    props = await c.properties(OBJECT_PATH, MANAGER_INTERFACE)
    broken = dict(props.get("BrokenPresets", {}))
    for r in rows:
        if r["Name"] in broken:
            r["Error"] = broken.pop(r["Name"])
            if r["State"] in ("inactive", "failed"):
                r["State"] = "broken"
    return rows, broken


async def cmd_presets(c: Client, as_json: bool) -> int:
    """Every preset, the broken ones too: a file that does not parse (no object) and a
    preset whose next start cannot be planned (BrokenPresets has both): state "broken"
    unless its engine runs, and the error."""
    rows, broken = await shown_rows(c)
    if as_json:
        _print_json(rows + [{"Name": name, "State": "broken", "Error": error}
                            for name, error in sorted(broken.items())])
        return EXIT_OK
    from . import stats as ctlstats

    print(ctlstats.columns([list(PRESETS_COLUMNS), *preset_lines(rows, broken)]))
    peers = ctlstats.peers_text(dict((await c.properties(OBJECT_PATH, MANAGER_INTERFACE))
                                     .get("Peers") or {}))
    if peers:   # where the gateway relays what this host does not serve
        print("\n" + peers)
    return EXIT_OK


PRESETS_COLUMNS = ("PRESET", "STATE", "SPEC", "URL", "UP", "GPU MEM", "NEEDS", "MODEL")


def preset_lines(rows: list[dict[str, Any]], broken: dict[str, str]) -> list[list[str]]:
    """The cells of ``lokictl presets`` (:data:`PRESETS_COLUMNS`), one line a preset."""
    from . import sight as ctlsight
    from . import stats as ctlstats

    now = time.time()
    lines = []
    for r in rows:
        top = ctlstats.row(r)   # what is live only (URL, uptime, memory) is "-" otherwise
        blocked = "  (auto cut: " + r["AutoSpecBlocked"] + ")" if r["AutoSpecBlocked"] else ""
        error = "  (broken: " + r["Error"] + ")" if r.get("Error") else ""
        said = ", ".join(t for t in (ctlsight.sight_text(r, now), idle_text(r, now)) if t)
        idle = f"  ({said})" if said else ""
        if r.get("Kind") == "external":   # an API elsewhere: where, and whether it answers
            lines.append([r["Name"], "external", "-", r.get("Url") or "-", "-", "-", "-",
                          f"{r.get('UpstreamModel')}  ({r.get('Reachable')})"])
            continue
        state = r["State"] + (" (unloading)" if r.get("Unloading") else "")
        lines.append([r["Name"], state, r["SpecMode"], top["url"] or "-",
                      ctlstats.duration(top["uptime_seconds"]), ctlstats.gpu_text(top),
                      ctlstats.need_text(r.get("Memory") or {}),
                      f"{r['Model']}{blocked}{idle}{error}{_fit(r)}"])
    return lines + [[name, "broken", "-", "-", "-", "-", "-", error]
                    for name, error in sorted(broken.items())]


def _fit(r: dict[str, Any]) -> str:
    why = (r.get("Memory") or {}).get("does_not_fit")
    return f"  (does not fit: {why})" if why else ""


async def cmd_devices(c: Client, as_json: bool) -> int:
    """Each device's memory: total, what lokid's engines and others hold, reserve, free."""
    from . import stats as ctlstats

    rows = (await c.properties(OBJECT_PATH, MANAGER_INTERFACE)).get("Devices") or []
    if as_json:
        _print_json(rows)
    else:
        print(ctlstats.devices_table(rows))
    return EXIT_OK


async def cmd_stats(c: Client, name: str, since: str | None, as_json: bool) -> int:
    """One preset's figures: the daemon's (its current start), or, with ``since``, the
    engine's journal over that window (every start in it)."""
    from . import logs as ctllogs
    from . import stats as ctlstats

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

    from . import stats as ctlstats

    async def rows() -> list[dict[str, Any]]:
        # what each is: an external API and a broken preset are not "inactive" engines
        shown, broken = await shown_rows(c)
        return [ctlstats.row(r) for r in shown] + [
            ctlstats.row({"Name": name, "State": "broken", "Error": error})
            for name, error in sorted(broken.items())]

    async def queues() -> list[dict[str, Any]]:
        """Who waits in the gateway (Usage's Queues); none from a daemon without them."""
        try:
            return list((await c.properties(OBJECT_PATH, USAGE_INTERFACE)).get("Queues") or [])
        except DBusError:
            return []

    async def devices(width: int | None = None) -> str:
        manager = await c.properties(OBJECT_PATH, MANAGER_INTERFACE)
        said = [ctlstats.queues_text(await queues(), width),
                ctlstats.waits_text(dict(manager.get("Waits") or {}), width),
                ctlstats.peers_text(dict(manager.get("Peers") or {}), width)]
        return "\n\n".join([ctlstats.devices_table(manager.get("Devices") or [], width),
                            *(text for text in said if text)])

    if as_json:
        waits = dict((await c.properties(OBJECT_PATH, MANAGER_INTERFACE)).get("Waits") or {})
        queued = await queues()
        _print_json([{**r, **({"waiting": waits[r["preset"]]} if r.get("preset") in waits
                             else {}),
                      **({"queue": [{k: v for k, v in q.items() if k != "preset"}
                                    for q in queued if q.get("preset") == r.get("preset")]}
                         if any(q.get("preset") == r.get("preset") for q in queued) else {})}
                     for r in await rows()])
        return EXIT_OK
    if once or not sys.stdout.isatty():
        print(ctlstats.table(await rows()) + "\n\n" + await devices())
        return EXIT_OK
    quit_ = asyncio.Event()
    restore = _keys(quit_)
    try:
        while not quit_.is_set():
            width = shutil.get_terminal_size().columns
            text = ctlstats.table(await rows(), width) + "\n\n" + await devices(width)
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
    if row.get("Kind") == "external":   # nothing runs here: where its API is instead
        for key in ("Name", "Kind", "Url", "UpstreamModel", "Reachable"):
            print(f"{key}: {row[key]}")
        for note in row["Notes"]:
            print(f"  - {note}")
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
    print("Serve: " + serve_text(row))
    from .replicas import replica_lines  # its engines, when several run (issue 47)

    for line in replica_lines({name: list(row.get("Replicas") or [])}):
        print(line[:1].upper() + line[1:])
    memory = row.get("Memory") or {}
    if memory.get("text"):
        print(f"Memory: {memory['text']}")
    if memory.get("does_not_fit"):
        print(f"DoesNotFit: {memory['does_not_fit']}")
    if idle_text(row, time.time()):
        print("IdleStopAt: " + idle_text(row, time.time()))
    _show_sight(row)
    for note in row["Notes"]:
        print(f"  - {note}")
    return EXIT_OK


def _show_sight(row: dict[str, Any]) -> None:
    """show's on-demand lines: the state, the last request, the group's holder, the
    counters (:mod:`lokid.ctl.sight`)."""
    from . import sight as ctlsight

    if row.get("OnDemandState"):
        print(f"OnDemandState: {row['OnDemandState']}")
    if row.get("LastRequestAt"):
        print(f"LastRequestAt: {ctlsight.ago(float(row['LastRequestAt']), time.time())}")
    if row.get("Group"):
        print(f"GroupHolder: {row.get('GroupHolder') or '-'} ({ctlsight.holder_text(row)})")
    counters = ctlsight.counters_text(dict(row.get("Stats") or {}))
    if counters:
        print(f"OnDemandCounters: {counters}")


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
    memory = plan.get("memory") or {}
    if memory.get("text"):
        print(f"memory: {memory['text']}")
    if memory.get("does_not_fit"):
        print(f"does not fit: {memory['does_not_fit']}")
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
    """What to run after a job ended badly (an external preset never gets a job: the
    daemon refuses its verbs with what it is)."""
    if result == "canceled":
        return "another start, stop or restart replaced it"
    if verb in ("stop", "unload"):
        return f"see `lokictl logs {name} -n 30`; `lokictl stop {name}` tries again"
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
    if verb == "stop" and (await c.properties(path, PRESET_INTERFACE)).get("OnDemand"):
        from ..core.launch.portunit import stop_note

        print(f"lokictl: {stop_note(name)}", file=sys.stderr)
    if not wait:
        return EXIT_OK
    target = "stopped" if verb in ("stop", "unload") else "ready"
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
    if result == "done" and (verb in ("stop", "unload") or state == "ready"):
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
                    as_json: bool, repeat: int = 1) -> int:
    """Benchmark the preset's ready engine; progress from BenchProgress, then the report.
    A single run calls Bench, which every daemon has; a repeated one BenchRepeat."""
    from dbus_fast import Message, MessageType

    from ..core.bench import rules as benchrules

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
        if repeat == 1:
            (outcome,) = await c._call(OBJECT_PATH, MANAGER_INTERFACE, "Bench", "ssuu",
                                       [name, mode, predict, prompt])
        else:
            (outcome,) = await c._call(OBJECT_PATH, MANAGER_INTERFACE, "BenchRepeat", "ssuuu",
                                       [name, mode, predict, prompt, repeat])
    finally:
        if tty and not as_json:
            sys.stderr.write("\r\033[K")
    data = plain(outcome)
    if as_json:
        _print_json(data)
        return EXIT_OK
    result = benchrules.result_from_json(data["result"])
    runs = f", {result.repeat} runs" if result.repeat > 1 else ""
    print(f"{name}: {mode} benchmark at {data.get('url', '')}{runs}")
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

