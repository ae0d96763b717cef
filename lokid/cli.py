"""The ``lokid`` command: ``plan``, ``run``, the unit helpers ``prestart``, ``engine`` and
``stopped``, ``generate``, ``watch`` (the journal watcher alone), ``daemon`` (the
D-Bus service) and ``gateway`` (one HTTP endpoint for every preset).

Arguments become typed calls here; no argparse object leaves this module.
A preset name is checked before anything else (:func:`_preset_name`): no file
named after it is read or written. Errors are one line on stderr, or one journal
entry when stderr is the journal (a traceback only with ``--debug``). Exit
status: 0 on success, 2 for a config/preset/model/engine problem, 1 for a
busy port; ``run`` otherwise exits with the engine's own status; ``engine`` exits
78 when the preset cannot start as it is and 69 when the crash-loop rule stops
its restarts (the unit's RestartPreventExitStatus=); ``prestart`` in the unit exits 0
when the start must not run, and leaves the status and the reason to ``engine``.
"""

from __future__ import annotations

import sys

from . import __version__
from .core import paths
from .core.errors import BusyError, ConfigError, LokiError
from .host.journallog import journal_log

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing; mypy knows the name
if TYPE_CHECKING:
    import argparse
    from collections.abc import Callable, Sequence
    from typing import NoReturn

    from .core.config.external import External
    from .core.launch.conflicts import ListenSource

# Imports of each command stay inside it: `lokid engine` is on the path from
# `systemctl start` to READY, and every module loaded there delays readiness.

EXIT_CONFIG = 2
EXIT_BUSY = 1
# The commands whose argument is a preset name. `engine` checks its own (the unit's
# ExecStart: its STATUS= and exit status 78 say why, and stop the restarts), and so
# does `prestart` (ExecStartPre: by hand, exit 2 as here; in the unit, exit 0 and
# `engine` says it).
PRESET_COMMANDS = ("plan", "run", "prestart", "stopped", "bench")
# The engine unit's steps (ExecStartPre, ExecStart, ExecStopPost): `lokid <step> <preset>`
# runs without argparse, and ends without Python's teardown (:func:`entry`)
UNIT_STEPS = ("prestart", "engine", "stopped")


def _preset_name(name: str) -> str:
    """``name``, when it is a preset name; ConfigError (exit 2) otherwise, before any
    file named after it (a preset, a runtime plan, a failure record) is opened:
    ``../x`` would name one outside its directory. A replica's instance (``NAME:k``,
    :mod:`lokid.core.serve.replicas`) is one: the unit's steps run as ``lokid prestart NAME:2``."""
    from .core.serve.replicas import check_instance_name

    check_instance_name(name)
    return name


def _repeat(text: str) -> int:
    """``--repeat``'s count, bounded: argparse's usage error (exit 2) otherwise."""
    import argparse

    from .core.bench.repeat import MAX_REPEAT, repeat_error

    n = int(text) if text.strip().lstrip("-").isdigit() else 0
    if repeat_error(n):
        raise argparse.ArgumentTypeError(f"{text!r} is not a count of 1 to {MAX_REPEAT}")
    return n


def _listening(config_dir: str, name: str) -> tuple[str, int, ListenSource]:
    """Where the preset's engine will listen, and which files set the host and the port
    (for an error about either)."""
    from .core.config import files as cfg
    from .core.launch.conflicts import listen_address, listen_source
    from .core.serve.replicas import preset_of

    preset, glob = cfg.load_preset(config_dir, preset_of(name)), cfg.load_global(config_dir)
    return (*listen_address(preset, glob), listen_source(preset, glob))


def _external(config_dir: str, name: str) -> External | None:
    """The preset's external API (``kind = "external"``), or None for an engine."""
    from .core.config import files as cfg
    from .core.serve.replicas import preset_of

    return cfg.load_preset(config_dir, preset_of(name)).external


def cmd_plan(config_dir: str, preset: str, as_json: bool) -> int:
    import json
    import os

    from .core.launch.plan import format_plan
    from .host.devices import explain, room_json
    from .host.nvml import GpuMemory
    from .planning.endpoint import check_address
    from .planning.gather import check_port_conflicts, unit_user
    from .planning.sizing import memory_now, refuse
    from .unit.planview import plan_inputs_now

    ext = _external(config_dir, preset)
    if ext is not None:   # nothing runs here: what the gateway does with it instead
        from .core.config.external import external_notes

        notes = external_notes(preset, ext)
        print(json.dumps({"preset": preset, "kind": "external", "url": ext.url,
                          "upstream_model": ext.upstream_model, "notes": notes}, indent=2,
                         ensure_ascii=False) if as_json else
              "\n".join([f"preset {preset}: external API, no engine", *notes]))
        return 0
    # As the next start will run it: as root, the files checked as loki-engine@.service's
    # user will open them; the attempt verdict read from the state DB, changing nothing.
    plan, inputs = plan_inputs_now(config_dir, paths.state_dir(), paths.runtime_dir(), preset)
    # the address as the start will bind it, and the port as that user may
    check_address(plan.host, plan.port, unit_user(os.environ),
                  _listening(config_dir, preset)[2])
    check_port_conflicts(config_dir, plan, runtime_dir=paths.runtime_dir())
    # what it needs on each device, and whether this host can ever hold it (a plan the
    # estimate cannot size, such as a KV type it does not know, is still shown)
    try:
        memory, room = memory_now(plan, inputs, paths.state_dir(), GpuMemory())
    except ConfigError as e:
        memory, room, unsized = None, None, f"unknown ({e})"
    chosen = ""   # gpus = "auto" / gpu_count: what a start now would choose, and why
    if plan.gpu_choice is not None and memory is not None and room is not None:
        from .planning.gpuchoice import choose_for

        chosen = choose_for(plan, inputs, memory, room, paths.runtime_dir())[1].why
    from .core.fleet.rpc import workers_of
    from .host.rpcprobe import probe_all

    workers = probe_all(workers_of(plan.argv))   # RPC workers: their devices, or why not
    replicas = [] if ":" in preset else _replicas(config_dir, preset,
                                                 inputs.preset.serve.max_replicas)
    if as_json:
        print(json.dumps({**plan.to_json(), "memory": memory.to_json() if memory else {},
                          **({"replicas": replicas} if replicas else {}),
                          "devices": room_json(room) if room else [],
                          **({"gpus_now": chosen} if chosen else {}),
                          **({"rpc_workers": [{
                              "endpoint": w.endpoint, "version": w.version, "problem":
                              w.problem, "busy": w.busy, "devices": [
                                  {"free": f, "total": t} for f, t in w.devices]}
                              for w in workers]} if workers else {})}, indent=2,
                         ensure_ascii=False))
    else:
        print(format_plan(plan))
        for row in replicas:
            print(f"replica {row['index']} ({row['unit']}): "
                  + str(row["command_line"] or f"cannot start: {row['error']}"))
        print(f"memory: {memory.text if memory else unsized}")
        if chosen:
            print(f"a start now: {chosen}")
        if room is not None:
            print("devices:")
            print("\n".join(f"  {line}" for line in explain(room)))
        if workers:
            print("RPC workers:")
            print("\n".join(f"  {w.text()}" for w in workers))
    if memory is not None and inputs.config.placement.enabled:
        refuse(memory, preset)
    elif memory is not None and memory.never:
        journal_log("", f"preset {preset!r} {memory.never}: [placement] enabled = false, so "
                    "it is not refused", priority=4)
    return 0


def _replicas(config_dir: str, preset: str, count: int) -> list[dict[str, object]]:
    """Each replica's row of ``lokid plan`` past the first (issue 47): its unit, port and
    command line, or why its start would be refused."""
    from .core.names import engine_unit
    from .core.serve.replicas import instance
    from .unit.planview import replica_plans

    rows: list[dict[str, object]] = []
    for k, found in replica_plans(config_dir, paths.state_dir(), paths.runtime_dir(), preset,
                                  count):
        row: dict[str, object] = {"index": k, "unit": engine_unit(instance(preset, k))}
        if isinstance(found, str):
            row.update(port=0, command_line="", argv=[], error=found)
        else:
            row.update(port=found.port, command_line=found.command_line(),
                       argv=list(found.argv), error="")
        rows.append(row)
    return rows


def cmd_run(config_dir: str, preset: str) -> int:
    from .core.launch.conflicts import listen_source
    from .core.launch.plan import build_plan
    from .planning.gather import gather
    from .unit.foreground import run_plan

    inputs = gather(config_dir, preset)
    return run_plan(build_plan(inputs), source=listen_source(inputs.preset, inputs.config))


def cmd_prestart(config_dir: str, preset: str) -> int:
    import os

    from .unit.keptstart import kept_start

    if kept_start(paths.runtime_dir(), preset, os.environ):
        return 0   # a restart that nothing changed: handed over without planning
    from .unit.steps import prestart_step

    return prestart_step(config_dir, paths.state_dir(), paths.runtime_dir(), preset)


def cmd_engine(config_dir: str, preset: str) -> int:
    import os

    from .unit.supervisor import PARENT_PID

    parent = os.environ.get(PARENT_PID, "")
    if parent.isdigit():   # the daemon's local runner: this step dies with it
        import signal

        from .host.proc import guard_self

        if not guard_self(int(parent), signal.SIGTERM):
            return 0   # the daemon died while this step was being spawned
        if preset == "-":   # the runner's spare step (lokid.unit.standby), told later
            from .unit.standby import Launcher, preload, told
            from .unit.steps import engine

            preload()
            launcher = Launcher()   # its child dies with this step when it is not used
            told_preset = told()
            if told_preset is None:
                return 0   # the runner closed the pipe: not needed any more
            return engine(config_dir, paths.state_dir(), paths.runtime_dir(), told_preset,
                          spawn=launcher.spawn)
    from .unit.steps import engine

    return engine(config_dir, paths.state_dir(), paths.runtime_dir(), preset)


def cmd_stopped(preset: str) -> int:
    from .unit.steps import stopped

    return stopped(paths.state_dir(), paths.runtime_dir(), preset)


def cmd_check(config_dir: str, presets: list[str] | None, workers: list[str] | None) -> int:
    from .unit.check import check

    ok, lines = check(config_dir, presets, workers)
    print("\n".join(lines))
    return 0 if ok else EXIT_CONFIG


def cmd_rpc_worker(config_dir: str, name: str) -> int:
    from .unit.rpcworker import run_worker

    return run_worker(config_dir, name)


def cmd_watch() -> int:
    """Follow the engines' journal and record layers-in-RAM verdicts until stopped."""
    import asyncio
    import signal

    from .watch.journalwatch import JournalWatcher

    async def watch() -> None:
        loop = asyncio.get_running_loop()
        done = asyncio.Event()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, done.set)
        watcher = JournalWatcher.system(
            paths.state_dir(), paths.runtime_dir(),
            on_verdict=lambda v: print(f"lokid: {v.preset}: {v.reason}", flush=True))
        watcher.attach(loop)
        try:
            await done.wait()
        finally:
            watcher.detach(loop)

    asyncio.run(watch())
    return 0


def cmd_bench(config_dir: str, preset: str, full: bool, predict: int, prompt: int,
              as_json: bool, repeat: int = 1) -> int:
    import asyncio
    import json

    from .bench.measure import measure, planned, sampler_here, started_here
    from .bench.protocol import Options
    from .core.bench import rules as benchrules

    if _external(config_dir, preset) is not None:
        from .core.config.external import BENCH_REFUSAL
        from .core.errors import ExternalPresetError

        raise ExternalPresetError(f"{preset}: {BENCH_REFUSAL}")

    def progress(phase: str, step: int, steps: int) -> None:
        print(f"  [{step}/{steps}] {phase}", file=sys.stderr, flush=True)

    opts = Options(benchrules.FULL if full else benchrules.QUICK, prompt=prompt, predict=predict,
                   repeat=repeat)
    if not as_json:
        runs = f", {repeat} runs" if repeat > 1 else ""
        print(f"lokid: benchmark of {preset}, {opts.mode} mode: prompt ~{prompt} tokens, "
              f"{predict} generated{runs}", file=sys.stderr, flush=True)
    plan_and_inputs = planned(config_dir, paths.state_dir(), preset)
    running = started_here(paths.runtime_dir(), preset)  # None: as the preset plans it now
    # the thrash hint (full mode): the engine's process, found in /proc by its port
    engine = running or plan_and_inputs[0]
    sampler = sampler_here(engine.port, engine.socket) if full else None
    out = asyncio.run(measure(config_dir, paths.state_dir(), preset, opts, progress,
                              io_sampler=sampler, plan_and_inputs=plan_and_inputs,
                              running=running))
    if as_json:
        print(json.dumps(out.reply(), indent=2))
    else:
        print("\n".join(benchrules.report(out.result, out.not_saved)))
    return 0


def cmd_daemon(config_dir: str, bus: str, bus_address: str | None, runner: str) -> int:
    from .dbus.daemon import main as daemon_main

    return daemon_main(config_dir, paths.state_dir(), paths.runtime_dir(), bus, bus_address,
                       runner)


def cmd_gateway(config_dir: str, bus: str, bus_address: str | None,
                listen: list[str] | None) -> int:
    import logging

    from .core.config import files as cfg
    from .gateway import settings as gws
    from .gateway.keys import Keyring
    from .gateway.server import run, serve

    # loki-gateway.socket's sockets, unless --listen says otherwise (tests, by hand)
    sockets = [] if listen else gws.inherited_sockets()
    addresses = listen or [gws.socket_address(s) for s in sockets]

    def reread() -> tuple[gws.Settings, tuple[str, ...]]:   # at start, and at each reload
        glob = cfg.load_global(config_dir)
        return gws.settings_of(glob.gateway, addresses, glob.placement), glob.gateway.listen

    settings = reread()[0]
    configured = settings.api_keys_file
    legacy = gws.read_keys(gws.keys_path(configured), configured) if configured else frozenset()
    keys = Keyring(legacy, settings.keys_file)   # and the named keys file (lokictl keys)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    fixed = "the addresses are --listen's, on the command line" if listen else \
        "the addresses are loki-gateway.socket's (`systemctl edit loki-gateway.socket`, then " \
        "restart it)" if sockets else ""
    run(serve(settings, bus, bus_address, keys, sockets, reread, fixed))   # uvloop if there
    return 0


def cmd_generate(config_dir: str, dirs: list[str]) -> int:
    from .unit.generator import generate

    # systemd passes three directories (normal, early, late); by hand, one is enough.
    generate(config_dir, dirs[0])
    return 0


def _parser() -> argparse.ArgumentParser:
    import argparse

    from .core.bench.repeat import MAX_REPEAT

    p = argparse.ArgumentParser(prog="lokid", description="Run llama-server presets.")
    p.add_argument("--version", action="version", version=f"lokid {__version__}")
    p.add_argument("--config-dir", help="config directory (default $LOKI_CONFIG_DIR or "
                   f"{paths.DEFAULT_CONFIG_DIR})")
    p.add_argument("--debug", action="store_true", help="show tracebacks")
    sub = p.add_subparsers(dest="command", required=True)
    plan = sub.add_parser("plan", help="show the engine command line for a preset, and why")
    plan.add_argument("preset")
    plan.add_argument("--json", action="store_true", help="machine-readable output")
    run = sub.add_parser("run", help="run a preset's engine in the foreground")
    run.add_argument("preset")
    pre = sub.add_parser("prestart", help="ExecStartPre of loki-engine@.service: plan the "
                         "start, check the port, settle the attempt token, write the runtime "
                         "plan")
    pre.add_argument("preset")
    eng = sub.add_parser("engine", help="ExecStart of loki-engine@.service: run and supervise "
                         "the engine as prestart planned it")
    eng.add_argument("preset")
    stp = sub.add_parser("stopped", help="ExecStopPost of loki-engine@.service: record how "
                         "the start ended ($SERVICE_RESULT)")
    stp.add_argument("preset")
    dmn = sub.add_parser("daemon", help="serve the presets on D-Bus as org.lokid.Lokid1")
    dmn.add_argument("--bus", choices=("system", "session"), default="system",
                     help="which bus (default: system; session for development)")
    dmn.add_argument("--bus-address", help="connect to this bus address instead")
    dmn.add_argument("--runner", choices=("auto", "systemd", "local"), default="auto",
                     help="how engines run: systemd units, or the daemon's own children "
                     "(default auto: systemd on the system bus of a systemd host)")
    gw = sub.add_parser("gateway", help="serve every preset on one OpenAI endpoint, routed "
                        "by model (foreground)")
    gw.add_argument("--bus", choices=("system", "session"), default="system",
                    help="the daemon's bus (default: system)")
    gw.add_argument("--bus-address", "--address", dest="bus_address",
                    help="connect to this bus address instead")
    gw.add_argument("--listen", action="append", metavar="HOST:PORT",
                    help="listen here instead of lokid.toml's [gateway] listen (repeatable)")
    bch = sub.add_parser("bench", help="benchmark a preset's running engine (protocol v2)")
    bch.add_argument("preset")
    bch.add_argument("--full", action="store_true", help="add the depth phase (a real "
                     "conversation at half the context, cache reuse, draft acceptance)")
    bch.add_argument("--predict", type=int, default=300, help="tokens generated by the short "
                     "line (default 300)")
    bch.add_argument("--prompt", type=int, default=2000, help="prompt tokens of the short line "
                     "(default 2000)")
    bch.add_argument("--repeat", type=_repeat, default=1, metavar="N", help="measure N times "
                     "after one warm-up: each figure's median and spread (1 to "
                     f"{MAX_REPEAT}, default 1)")
    bch.add_argument("--json", action="store_true", help="machine-readable output")
    chk = sub.add_parser("check", help="check lokid.toml, presets and RPC workers with "
                         "lokid's own rules and planner, starting nothing (all of them "
                         "unless some are named)")
    chk.add_argument("--preset", action="append", metavar="NAME", help="this preset only "
                     "(repeatable)")
    chk.add_argument("--rpc", action="append", metavar="NAME", help="this RPC worker only "
                     "(repeatable)")
    rpcw = sub.add_parser("rpc-worker", help="ExecStart of loki-rpc@.service: run the RPC "
                          "worker of rpc/NAME.toml (llama.cpp's ggml-rpc-server)")
    rpcw.add_argument("name")
    sub.add_parser("watch", help="follow the engines' journal and record verdicts (what the "
                   "daemon does; for hosts without it)")
    sub.add_parser("gpu-nodes", help="ExecStart of loki-gpu-nodes.service: the NVIDIA "
                   "driver's modules and device nodes, made as root once at boot")
    pw = sub.add_parser("pull-worker", help="ExecStart of a model pull's unit (lokictl pull "
                        "starts it through the daemon): fetch REFERENCE into DIR")
    pw.add_argument("reference")
    pw.add_argument("--dir", required=True, metavar="DIR")
    pw.add_argument("--status-file", metavar="FILE", help="where progress is written (JSON)")
    pw.add_argument("--retries", type=int, default=20, metavar="N",
                    help="tries without progress after a transient fault (default 20)")
    gen = sub.add_parser("generate", help="systemd generator: per-preset drop-ins")
    gen.add_argument("dirs", nargs="+", metavar="DIR")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if len(argv) == 2 and argv[0] in UNIT_STEPS and argv[1] not in ("-h", "--help"):
        # The unit's ExecStartPre, ExecStart and ExecStopPost, fixed command lines: skip
        # argparse and the parser's own imports (the bench's rules: ~20 ms under the
        # unit's sandbox, which a stop, and so a restart or a swap, waited for).
        # Whatever the instance name, even "-rf": argparse would exit 2, which the unit
        # restarts forever; `prestart` leaves a bad name to `engine`, which refuses it
        # with 78, which the unit does not restart; `stopped` refuses it (exit 2, which
        # ExecStopPost=- ignores).
        name = argv[1]
        if argv[0] == "stopped":
            return _guard(lambda: cmd_stopped(name), debug=False)
        step = cmd_prestart if argv[0] == "prestart" else cmd_engine
        return _guard(lambda: step(paths.config_dir(), name), debug=False)
    args = _parser().parse_args(argv)
    config_dir: str = args.config_dir or paths.config_dir()
    command: str = args.command

    def dispatch() -> int:
        if command in PRESET_COMMANDS:
            _preset_name(args.preset)
        if command == "plan":
            return cmd_plan(config_dir, args.preset, bool(args.json))
        if command == "run":
            return cmd_run(config_dir, args.preset)
        if command == "prestart":
            return cmd_prestart(config_dir, args.preset)
        if command == "engine":
            return cmd_engine(config_dir, args.preset)
        if command == "stopped":
            return cmd_stopped(args.preset)
        if command == "watch":
            return cmd_watch()
        if command == "check":
            named = args.preset is not None or args.rpc is not None
            return cmd_check(config_dir, list(args.preset or []) if named else None,
                             list(args.rpc or []) if named else None)
        if command == "rpc-worker":
            return cmd_rpc_worker(config_dir, args.name)
        if command == "bench":
            return cmd_bench(config_dir, args.preset, bool(args.full), int(args.predict),
                             int(args.prompt), bool(args.json), int(args.repeat))
        if command == "daemon":
            return cmd_daemon(config_dir, args.bus, args.bus_address, args.runner)
        if command == "gateway":
            return cmd_gateway(config_dir, args.bus, args.bus_address, args.listen)
        if command == "pull-worker":
            from .unit import pullworker

            return pullworker.main(args.reference, args.dir, args.status_file,
                                   max(1, int(args.retries)))
        if command == "gpu-nodes":
            import os

            from .unit import gpunodes

            # LOKI_NVIDIA_GPUS_DIR: the driver's /proc listing, which a test's container
            # (whose /proc is the kernel's own) can only give from elsewhere
            return gpunodes.run(gpus_dir=os.environ.get("LOKI_NVIDIA_GPUS_DIR",
                                                        gpunodes.GPUS_DIR))
        return cmd_generate(config_dir, list(args.dirs))

    return _guard(dispatch, debug=bool(args.debug))


def entry() -> NoReturn:
    """The ``lokid`` command (and ``python -m lokid``): :func:`main`, then the process's
    end; a unit step's (``prestart``, ``engine``, ``stopped``) without Python's teardown."""
    status = main()
    argv = sys.argv[1:]
    if len(argv) == 2 and argv[0] in UNIT_STEPS:
        _exit_now(status)
    sys.exit(status)


def _exit_now(status: int) -> NoReturn:
    """The end of a unit step, without Python's own teardown (every module freed, the
    collector run: a few ms that a start, or a swap waiting for a stop, would wait for,
    and nothing the step needs): what it wrote is flushed, its files were closed by its
    own code; the one exit handler lokid registers, the engine probe's, is run."""
    import os

    probe = sys.modules.get("lokid.host.probe")
    if probe is not None:   # probes still running in the background die with the step
        probe.kill_running()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(status)


def _guard(call: Callable[[], int], debug: bool) -> int:
    """Run a command; a LokiError becomes one line on stderr and an exit status."""
    try:
        return call()
    except BusyError as e:  # a port in use too
        journal_log("", str(e), priority=3)
        return EXIT_BUSY
    except LokiError as e:
        journal_log("", str(e), priority=3)
        if debug:
            import traceback

            traceback.print_exc()
        return EXIT_CONFIG
    except KeyboardInterrupt:
        return 130

if __name__ == "__main__":
    entry()
