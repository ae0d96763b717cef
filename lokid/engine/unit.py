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

The state DB never stops a start nor a healthy engine (:mod:`lokid.engine.state`):
a start that cannot set its token runs without automatic speculation and says
why; a token that cannot be cleared at READY (or at a stop while loading) is
noted in the runtime directory instead (:func:`~lokid.engine.state.note_cleared`)
and the next start counts it as cleared; either is one journal line.

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

    from ..core.attempt import Mark, Verdict
    from ..core.plan import Plan, PlanInputs
    from ..core.runtimeplan import RuntimePlan
    from .notify import Notifier
    from .state import StateDB, Token


def prestart(config_dir: str, state_dir: str, runtime_dir: str, name: str,
             environ: Mapping[str, str] | None = None) -> Plan:
    """Plan the launch of ``name``, settle its attempt token, write the runtime plan."""
    return _prestart(config_dir, state_dir, runtime_dir, name, environ).plan


class _Planned:
    """A start's plan as ``_prestart`` made it: what ``engine`` needs afterwards."""

    __slots__ = ("plan", "mark", "inputs", "verdict", "runtime", "token")

    def __init__(self, plan: Plan, mark: Mark, inputs: PlanInputs, verdict: str,
                 runtime: RuntimePlan, token: Token | None):
        self.plan, self.mark, self.inputs = plan, mark, inputs
        self.verdict, self.runtime, self.token = verdict, runtime, token


def _prestart(config_dir: str, state_dir: str, runtime_dir: str, name: str,
              environ: Mapping[str, str] | None = None,
              log_notes: bool = True) -> _Planned:
    from ..core.conflicts import listen_source
    from ..core.errors import StateError
    from ..core.runtimeplan import RuntimePlan
    from .endpoint import check_port_free
    from .gather import check_port_conflicts, decide, gather
    from .runtimedir import write_runtime_plan
    from .state import StateDB, StateReader, needs_token, read_cleared

    environ = dict(os.environ if environ is None else environ)
    inputs = gather(config_dir, name, environ)
    cleared = read_cleared(runtime_dir, name)
    db: StateDB | StateReader
    unusable: StateError | None = None
    try:
        db = StateDB(state_dir)
    except StateError as e:  # nothing to write to: look, and start without a token
        db, unusable = StateReader(state_dir), e
    with db:
        plan, mark, found = decide(inputs, db, cleared=cleared)
        check_port_conflicts(config_dir, plan, inputs.config)  # two presets, one port
        # Before any token moves: a second start refused because the first is
        # still loading must not count the first one's token as a failure.
        check_port_free(plan.host, plan.port, runtime_dir,
                        listen_source(inputs.preset, inputs.config))
        token = None
        if isinstance(db, StateDB):
            try:
                token = _settle(db, runtime_dir, name, mark, found, plan.spec.auto, cleared)
            except StateError as e:
                unusable = e
        if unusable is not None and plan.spec.auto:
            plan, mark, found = decide(inputs, db, cleared=cleared,
                                       blocked=needs_token(str(unusable)))
    rp = RuntimePlan.of(plan, mark, environ.get("INVOCATION_ID", ""), pid=os.getpid())
    write_runtime_plan(runtime_dir, rp)
    if log_notes:
        _log_plan(name, plan.notes, plan.command_line())
    return _Planned(plan, mark, inputs, found.why, rp, token)


def _settle(db: StateDB, runtime_dir: str, name: str, mark: Mark, found: Verdict,
            attempt: bool, cleared: Token | None) -> Token | None:
    """:meth:`StateDB.settle`, and the runtime directory's note of a cleared token
    forgotten once the token it spoke for is gone; the new token. StateError from the
    settle: nothing changed, the note stays."""
    if cleared is None:
        return db.settle(name, mark, found, attempt)
    was = db.token(name) == cleared
    token = db.settle(name, mark, found, attempt)
    from .state import forget_cleared

    try:
        forget_cleared(runtime_dir, name)
    except OSError as e:
        journal_log(name, f"the note of a cleared attempt token was not removed: {e}",
                    priority=4)
    if was:
        journal_log(name, "the last automatic launch's attempt token, which the state "
                    "database could not clear then, counted as cleared and is gone now")
    return token


def _log_plan(name: str, notes: tuple[str, ...], command_line: str, how: str = "") -> None:
    """Each note as its own journal entry, then the command line."""
    for note in notes:
        journal_log(name, note)
    journal_log(name, f"plan{how}: {command_line}", priority=6)


def _reuse(state_dir: str, runtime_dir: str, name: str, invocation: str,
           environ: Mapping[str, str]) -> tuple[RuntimePlan, Token | None] | None:
    """The plan of the last start that became ready, settled and written for this start,
    with its token, when nothing it came from changed and the attempt verdict is the one
    it was planned with (:mod:`lokid.engine.plancache`); None: plan afresh (the state DB
    failing included: planning afresh says what that means)."""
    from . import plancache

    found = plancache.reusable(runtime_dir, name, environ)
    if found is None:
        return None
    from dataclasses import replace

    from ..core.errors import StateError
    from ..core.runtimeplan import RuntimePlan
    from .endpoint import check_port_free
    from .runtimedir import write_runtime_plan
    from .state import StateDB, read_cleared

    data, verdict = found
    try:
        rp = RuntimePlan.from_json(data)
    except ValueError:
        return None
    cleared = read_cleared(runtime_dir, name)
    try:
        with StateDB(state_dir) as db:
            now = db.peek(name, rp.mark, cleared=cleared)
            if now.why != verdict or now.record:
                return None
            check_port_free(rp.host, rp.port, runtime_dir)
            token = _settle(db, runtime_dir, name, rp.mark, now, rp.auto, cleared)
    except StateError:
        return None
    rp = replace(rp, invocation=invocation, pid=os.getpid())
    write_runtime_plan(runtime_dir, rp)
    return rp, token


def plan_now(config_dir: str, state_dir: str, runtime_dir: str, name: str,
             environ: Mapping[str, str] | None = None) -> Plan:
    """The plan the next start of ``name`` runs, as ``lokid plan`` shows it: the attempt
    verdict read from the state DB without changing it (the DB is never created or
    written here), and a token of a launch that is loading now shown as such.

    A state DB that cannot be read (damaged, or not readable by this user) is read as
    empty, said in a note (:class:`~lokid.engine.state.StateReader`).
    """
    from .gather import decide, gather
    from .state import StateReader, read_cleared

    inputs = gather(config_dir, name, environ, for_unit=True)
    with StateReader(state_dir) as db:
        plan, _, _ = decide(inputs, db, loading=_loading(runtime_dir, name),
                            cleared=read_cleared(runtime_dir, name))
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
    from ..core.presetname import check_preset_name

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
        reused = _reuse(state_dir, runtime_dir, name, invocation, os.environ)
        if reused is None:
            # the notes are logged once the engine is spawned: the journal's client
            # library loads while the engine does, not before it
            planned = _prestart(config_dir, state_dir, runtime_dir, name, log_notes=False)
            rp, token = planned.runtime, planned.token
        else:
            rp, token = reused
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

        if rp.auto:
            _clear_token(state_dir, runtime_dir, name, rp.mark, token, "ready")
        try:
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
    if _clear_token(state_dir, runtime_dir, name, rp.mark, None, "stopped while loading"):
        journal_log(name, "stopped while loading: not counted against automatic "
                    "speculative decoding")


def _clear_token(state_dir: str, runtime_dir: str, name: str, mark: Mark,
                 token: Token | None, what: str) -> bool:
    """Clear this launch's attempt token (``what``: why it counts as cleared); when the
    state DB cannot, note the token in the runtime directory so that the next start
    counts it as cleared all the same. ``token``: the one this launch set, None to read
    it. Whether it was cleared or noted. Never raises: each failure is one journal line.
    """
    from ..core.errors import StateError
    from .state import StateDB, StateReader, note_cleared

    try:
        with StateDB(state_dir) as db:
            return db.clear(name, mark)
    except StateError as e:
        failed = e
    if token is None:
        with StateReader(state_dir) as reader:
            token = reader.token(name)
        if token is not None and token.mark != mark.key():
            return False  # not this configuration's token: not ours to excuse
    if token is None:
        journal_log(name, f"{what}, but its attempt token was not cleared: {failed}; if it "
                    "is still there, the next start runs without automatic speculation",
                    priority=4)
        return False
    try:
        path = note_cleared(runtime_dir, name, token)
    except OSError as e:
        journal_log(name, f"{what}, but its attempt token was not cleared: {failed}, nor "
                    f"noted in {runtime_dir} ({e}); the next start runs without automatic "
                    "speculation", priority=4)
        return False
    journal_log(name, f"{what}, but its attempt token was not cleared: {failed}; noted in "
                f"{path}, the next start counts it as cleared", priority=4)
    return True
