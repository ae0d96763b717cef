"""What ``loki-engine@.service`` runs: ``lokid engine`` (ExecStart) and ``lokid stopped``
(ExecStopPost).

``engine`` is the unit's main process from the first instruction, so that its
STATUS= line and its exit status are what ``systemctl status`` shows:

1. the crash-loop rule (:mod:`lokid.core.crashloop`): after too many failures
   it exits :data:`~lokid.core.crashloop.EXIT_CRASH_LOOP` and says why; a
   start by hand (systemd's ``NRestarts`` is 0) forgets the failures first;
2. :func:`prestart`: plan the launch, refuse a busy port before touching any
   attempt token (peek, then settle), write the plan of this invocation
   (:class:`lokid.core.runtimeplan.RuntimePlan`) to
   ``$LOKI_RUNTIME_DIR/<preset>.json`` and log each note as its own journal
   entry. A preset that cannot start as it is exits
   :data:`~lokid.core.crashloop.EXIT_CONFIG` with its one-line error as
   STATUS=; the unit's ``RestartPreventExitStatus=`` makes that final;
3. supervise llama-server (:mod:`lokid.engine.supervisor`); on READY, clear
   its own attempt token (the next start of the same configuration may try
   again) and mark the start ready.

``stopped`` reads how systemd ended the start (``$SERVICE_RESULT``,
``$EXIT_CODE``, ``$EXIT_STATUS``): a failure is recorded for the crash-loop
rule; a clean stop (the operator's, shutdown, ``apt remove``) while an
automatic launch was loading clears its attempt token, since a stop is not
the launch failing. A crash, a hang (watchdog) or a start timeout leaves the
token, and the next start cuts automatic speculation.

The prestart, planning and state modules are imported inside the functions
that use them: ``engine`` is on the path from ``systemctl start`` to READY.
"""

from __future__ import annotations

import os

from .journallog import journal_log
from .runtimedir import read_runtime_plan

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing; mypy knows the name
if TYPE_CHECKING:
    from collections.abc import Mapping

    from ..core.attempt import Mark
    from ..core.plan import Plan, PlanInputs
    from ..core.runtimeplan import RuntimePlan
    from .notify import Notifier


def prestart(config_dir: str, state_dir: str, runtime_dir: str, name: str,
             environ: Mapping[str, str] | None = None) -> Plan:
    """Plan the launch of ``name``, settle its attempt token, write the runtime plan."""
    return _prestart(config_dir, state_dir, runtime_dir, name, environ).plan


class _Planned:
    """A start's plan as ``_prestart`` made it: what ``engine`` needs afterwards."""

    __slots__ = ("plan", "mark", "inputs", "verdict", "runtime")

    def __init__(self, plan: Plan, mark: Mark, inputs: PlanInputs, verdict: str,
                 runtime: RuntimePlan):
        self.plan, self.mark, self.inputs = plan, mark, inputs
        self.verdict, self.runtime = verdict, runtime


def _prestart(config_dir: str, state_dir: str, runtime_dir: str, name: str,
              environ: Mapping[str, str] | None = None,
              log_notes: bool = True) -> _Planned:
    from ..core.runtimeplan import RuntimePlan
    from .endpoint import check_port_free
    from .gather import check_port_conflicts, decide, gather
    from .runtimedir import write_runtime_plan
    from .state import StateDB

    environ = dict(os.environ if environ is None else environ)
    inputs = gather(config_dir, name, environ)
    with StateDB(state_dir) as db:
        plan, mark, found = decide(inputs, db)
        check_port_conflicts(config_dir, plan, inputs.config)  # two presets, one port
        # Before any token moves: a second start refused because the first is
        # still loading must not count the first one's token as a failure.
        check_port_free(plan.host, plan.port, runtime_dir)
        db.settle(name, mark, found, attempt=plan.spec.auto)
    rp = RuntimePlan.of(plan, mark, environ.get("INVOCATION_ID", ""), pid=os.getpid())
    write_runtime_plan(runtime_dir, rp)
    if log_notes:
        _log_plan(name, plan.notes, plan.command_line())
    return _Planned(plan, mark, inputs, found.why, rp)


def _log_plan(name: str, notes: tuple[str, ...], command_line: str, how: str = "") -> None:
    """Each note as its own journal entry, then the command line."""
    for note in notes:
        journal_log(name, note)
    journal_log(name, f"plan{how}: {command_line}", priority=6)


def _reuse(state_dir: str, runtime_dir: str, name: str, invocation: str,
           environ: Mapping[str, str]) -> RuntimePlan | None:
    """The plan of the last start that became ready, settled and written for this start,
    when nothing it came from changed and the attempt verdict is the one it was planned
    with (:mod:`lokid.engine.plancache`); None: plan afresh."""
    from . import plancache

    found = plancache.reusable(runtime_dir, name, environ)
    if found is None:
        return None
    from dataclasses import replace

    from ..core.runtimeplan import RuntimePlan
    from .endpoint import check_port_free
    from .runtimedir import write_runtime_plan
    from .state import StateDB

    data, verdict = found
    try:
        rp = RuntimePlan.from_json(data)
    except ValueError:
        return None
    with StateDB(state_dir) as db:
        now = db.peek(name, rp.mark)
        if now.why != verdict or now.record:
            return None
        check_port_free(rp.host, rp.port, runtime_dir)
        db.settle(name, rp.mark, now, attempt=rp.auto)
    rp = replace(rp, invocation=invocation, pid=os.getpid())
    write_runtime_plan(runtime_dir, rp)
    return rp


def plan_now(config_dir: str, state_dir: str, runtime_dir: str, name: str,
             environ: Mapping[str, str] | None = None) -> Plan:
    """The plan the next start of ``name`` runs, as ``lokid plan`` shows it: the attempt
    verdict read from the state DB without changing it (the DB is never created or
    written here), and a token of a launch that is loading now shown as such.

    A state DB that cannot be read leaves the verdict unknown, said in a note.
    """
    from dataclasses import replace

    from ..core.errors import StateError
    from .gather import decide, gather
    from .state import StateReader

    inputs = gather(config_dir, name, environ, for_unit=True)
    try:
        with StateReader(state_dir) as db:
            plan, _, _ = decide(inputs, db, loading=_loading(runtime_dir, name))
    except StateError as e:
        from ..core.plan import build_plan

        plan = build_plan(inputs)
        if plan.spec.auto:
            plan = replace(plan, notes=(*plan.notes, f"{e}: whether the last automatic "
                                        "launch of this configuration failed is unknown"))
    return plan


def _loading(runtime_dir: str, name: str) -> bool:
    """Whether a start of ``name`` is under way and its engine has not answered yet: its
    runtime plan names a supervisor that still runs, and no READY is on record for it."""
    from ..core.errors import StalePlanError
    from . import exits

    try:
        rp = read_runtime_plan(runtime_dir, name)
    except StalePlanError:
        return False
    if not rp.pid or exits.was_ready(runtime_dir, name, rp.invocation):
        return False
    try:
        with open(f"/proc/{rp.pid}/cmdline", "rb") as f:
            argv = f.read().split(b"\0")
    except OSError:
        return False
    return b"engine" in argv and name.encode() in argv


def _check_name(name: str) -> None:
    """ConfigError for a name that is no preset name (``../x`` would name files outside
    the runtime directory)."""
    from ..core.config import check_preset_name

    check_preset_name(name)


def _crash_loop(runtime_dir: str, name: str, notifier: Notifier) -> str:
    """Why this start must not run (the crash-loop rule), or ""."""
    import time

    from ..core import crashloop
    from ..core.names import engine_unit
    from . import exits

    failures = exits.read_failures(runtime_dir, name)
    if not failures:
        return ""
    restarts = exits.automatic_restarts(engine_unit(name)) if notifier.enabled else 0
    if restarts == 0:  # a start by hand: what failed before it is forgiven
        try:
            exits.forget_failures(runtime_dir, name)
        except OSError as e:
            journal_log(name, f"the failures before this start were not forgotten: {e}",
                        priority=4)
        return ""
    if restarts is None:
        journal_log(name, "cannot ask systemd whether this start is an automatic restart: "
                    "counting it as one", priority=4)
    now = time.time()
    why = crashloop.stop_reason(failures, now)
    if not why:
        journal_log(name, crashloop.progress(failures, now))
    return why


def engine(config_dir: str, state_dir: str, runtime_dir: str, name: str) -> int:
    """Plan, then supervise the engine of this invocation; the exit status for systemd."""
    from ..core.crashloop import EXIT_CONFIG, EXIT_CRASH_LOOP
    from ..core.errors import LokiError
    from ..core.names import engine_unit
    from .notify import Notifier

    notifier = Notifier()
    invocation = os.environ.get("INVOCATION_ID", "")
    try:
        _check_name(name)  # before any file named after it is read
    except LokiError as e:
        notifier.send(f"STATUS={e}")
        journal_log("", str(e), priority=3)
        return EXIT_CONFIG
    stop = _crash_loop(runtime_dir, name, notifier)
    if stop:
        message = (f"{stop}; `systemctl start {engine_unit(name)}` (or `lokictl start {name}`) "
                   "tries again")
        notifier.send(f"STATUS={message}")
        journal_log(name, message, priority=3)
        return EXIT_CRASH_LOOP
    import time

    planned_at = time.time_ns()
    planned: _Planned | None = None
    try:
        rp = _reuse(state_dir, runtime_dir, name, invocation, os.environ)
        if rp is None:
            # the notes are logged once the engine is spawned: the journal's client
            # library loads while the engine does, not before it
            planned = _prestart(config_dir, state_dir, runtime_dir, name, log_notes=False)
            rp = planned.runtime
    except LokiError as e:
        notifier.send(f"STATUS={e}")
        journal_log(name, str(e), priority=3)
        return EXIT_CONFIG
    from .supervisor import Launch, supervise

    launch = Launch.of(name, rp.argv, rp.env, rp.host, rp.port)
    how = "" if planned is not None else \
        " (the last ready start's: nothing it was made from has changed)"
    command_line = rp.command_line()

    def on_ready(url: str) -> None:
        from . import exits, plancache

        try:
            if rp.auto:
                from .state import StateDB

                with StateDB(state_dir) as db:
                    db.clear(name, rp.mark)
            exits.mark_ready(runtime_dir, name, invocation)
            if planned is not None:
                plancache.record(runtime_dir, name,
                                 plancache.inputs_paths(config_dir, planned.inputs, os.environ),
                                 os.environ, rp.to_json(), planned.verdict, planned_at)
        except (LokiError, OSError) as e:  # never a reason to stop a healthy engine
            journal_log(name, f"ready, but its state was not saved: {e}", priority=4)

    def log(message: str) -> None:
        journal_log(name, message)

    return supervise(launch, log=log, notifier=notifier, on_ready=on_ready,
                     on_spawned=lambda: _log_plan(name, rp.notes, command_line, how),
                     unexpected_exit_fails=True)


def stopped(state_dir: str, runtime_dir: str, name: str,
            environ: Mapping[str, str] | None = None) -> int:
    """ExecStopPost=: count a failure, or forgive an operator's stop while loading."""
    import time

    from ..core.crashloop import Failure, exit_reason
    from ..core.errors import LokiError
    from . import exits

    _check_name(name)
    env = os.environ if environ is None else environ
    invocation = env.get("INVOCATION_ID", "")
    result = env.get("SERVICE_RESULT", "")
    ready = exits.was_ready(runtime_dir, name, invocation)
    why = exit_reason(result, env.get("EXIT_CODE", ""), env.get("EXIT_STATUS", ""),
                      ready=ready)
    try:
        if why:
            exits.record_failure(runtime_dir, name, Failure(time.time(), ready, why))
            journal_log(name, f"counted as a failure: {why}", priority=4)
        elif result == "success" and not ready:
            _forgive_stop(state_dir, runtime_dir, name, invocation)
    except (LokiError, OSError) as e:
        journal_log(name, f"how this start ended was not recorded: {e}", priority=4)
    return 0


def _forgive_stop(state_dir: str, runtime_dir: str, name: str, invocation: str) -> None:
    """A clean stop before READY: the automatic launch did not fail, its token goes."""
    from ..core.errors import StalePlanError

    try:
        rp = read_runtime_plan(runtime_dir, name, invocation)
    except StalePlanError:
        return  # stopped before this start had planned: nothing of it to clear
    if not rp.auto or rp.invocation != invocation:
        return
    from .state import StateDB

    with StateDB(state_dir) as db:
        if db.clear(name, rp.mark):
            journal_log(name, "stopped while loading: not counted against automatic "
                        "speculative decoding")
