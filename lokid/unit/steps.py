"""What ``loki-engine@.service`` runs: ``lokid prestart`` (ExecStartPre), ``lokid engine``
(ExecStart) and ``lokid stopped`` (ExecStopPost). ``prestart`` (:func:`prestart_step`),
the planning step:

1. the crash-loop rule (:mod:`lokid.core.launch.crashloop`): after too many failures the
   start must not run; a start by hand (``NRestarts`` 0) forgets the failures first;
2. plan the launch (:func:`prestart`; or the last ready start's plan, when nothing it
   came from changed: :mod:`lokid.store.plancache`), refuse a busy port before touching
   any attempt token (peek, then settle), write the plan of this invocation
   (:class:`lokid.core.launch.runtimeplan.RuntimePlan`) to ``$LOKI_RUNTIME_DIR/<preset>.json``.
   A restart that nothing changed, of a plan with nothing to settle, is decided before
   this module is imported (:mod:`lokid.unit.keptstart`): ``engine`` takes the kept plan;
3. leave the outcome to ``engine`` (:mod:`lokid.store.handoff`). A start that must not
   run is logged and handed over as refused, and the step exits 0: systemd reads
   ``RestartPreventExitStatus=`` from the main process only and shows only its STATUS=
   (``NotifyAccess=main``), so ``engine`` exits :data:`~lokid.core.launch.crashloop.EXIT_CONFIG`
   or :data:`~lokid.core.launch.crashloop.EXIT_CRASH_LOOP` with the line as STATUS=.

A SIGTERM while it plans (a stop or restart) ends it at once with status 0
(:class:`_StopGuard`): systemd counts a control process killed by its own SIGTERM as
``failed (signal)``. Between setting the token and writing the plan, the stop waits.

``engine`` is the unit's main process: its STATUS= lines and exit status are what
``systemctl status`` shows. It runs the plan its prestart step wrote (or, when none ran
for this start, as under the daemon's local runner, plans first the same way; or pulls a
model named by its hub reference first, :mod:`lokid.unit.pullfirst`) and supervises
llama-server (:mod:`lokid.unit.supervisor`); on READY it clears its own attempt token
(the next start of the same configuration may try again), marks the start ready and
keeps the plan for reuse. An engine that exits before it was ready because it refuses
its own command line (:mod:`lokid.unit.argcheck`) ends the start as a config error.

The state DB never stops a start nor a healthy engine (:mod:`lokid.store.state`): a
start that cannot set its token runs without automatic speculation and says why; a token
that cannot be cleared at READY (or at a stop while loading) is noted in the runtime
directory instead (:func:`~lokid.store.state.note_cleared`) and the next start counts it
as cleared; either is one journal line.

``stopped`` reads how systemd ended the start (``$SERVICE_RESULT``, ``$EXIT_CODE``,
``$EXIT_STATUS``): a failure is recorded for the crash-loop rule; a clean stop (the
operator's, shutdown, ``apt remove``) while an automatic launch was loading clears its
attempt token, since a stop is not the launch failing. A crash, a hang (watchdog) or a
start timeout leaves the token, and the next start cuts automatic speculation.

Planning and state modules are imported where used: both steps are on the path to
READY, and ``engine`` with a plan handed over imports neither before the spawn. A start
with RPC workers checks them first (:mod:`lokid.unit.workers`).
"""

from __future__ import annotations

import os

from ..host.journallog import journal_log
from ..store.runtimedir import read_runtime_plan
from .clearing import clear_token
from .workers import EXIT_WORKERS, WorkersDown, check_workers, names_workers, workers_after_exit

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing; mypy knows the name
if TYPE_CHECKING:
    from collections.abc import Callable, Mapping, Sequence
    from typing import Any

    from ..core.launch.attempt import Mark, Verdict
    from ..core.launch.plan import Plan, PlanInputs
    from ..core.launch.runtimeplan import RuntimePlan
    from ..store import handoff
    from ..store.state import StateDB, Token


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
    from ..core.errors import StateError
    from ..core.launch.conflicts import listen_source
    from ..core.launch.runtimeplan import RuntimePlan
    from ..planning.endpoint import check_listen_free
    from ..planning.gather import check_port_conflicts, decide, gather
    from ..store.runtimedir import write_runtime_plan
    from ..store.state import StateDB, StateReader, needs_token, read_cleared

    environ = dict(os.environ if environ is None else environ)
    inputs = gather(config_dir, name, environ, state_dir=state_dir)
    cleared = read_cleared(runtime_dir, name)
    check_workers(inputs.preset.rpc, inputs.preset.extra_args)
    # The slow part (probing the engine, reading the model) is done: a stop from here
    # waits until the token and the plan that lets `lokid stopped` excuse it are written.
    _stop.hold()
    db: StateDB | StateReader
    unusable: StateError | None = None
    try:
        db = StateDB(state_dir)
    except StateError as e:  # nothing to write to: look, and start without a token
        db, unusable = StateReader(state_dir), e
    with db:
        plan, mark, found = decide(inputs, db, cleared=cleared)
        # two presets, one port: the one that started on it last holds it
        check_port_conflicts(config_dir, plan, inputs.config, runtime_dir)
        # Before any token moves: a second start refused because the first is
        # still loading must not count the first one's token as a failure.
        check_listen_free(plan.host, plan.port, plan.socket, runtime_dir,
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
    if plan.gpu_choice is not None:   # gpus = "auto" / gpu_count: chosen now, one at a time
        from ..planning.gpuchoice import place_and_write

        plan, rp = place_and_write(plan, mark, inputs, runtime_dir, state_dir,
                                   environ.get("INVOCATION_ID", ""))
    else:
        rp = RuntimePlan.of(plan, mark, environ.get("INVOCATION_ID", ""), pid=os.getpid())
        write_runtime_plan(runtime_dir, rp)
    _stop.release()
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
    from ..store.state import forget_cleared

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
           environ: Mapping[str, str], defer_write: bool = False, keyed: bool = False
           ) -> tuple[RuntimePlan, Token | None, bool] | None:
    """The plan of the last start that became ready, settled and written for this start,
    with its token, when nothing it came from changed and the attempt verdict is the one
    it was planned with (:mod:`lokid.store.plancache`); None: plan afresh (the state DB
    failing included: planning afresh says what that means). The third item is True when
    the runtime plan is left for the caller to write: ``defer_write`` asked for it, and
    no token was settled (a token and the plan that lets ``lokid stopped`` excuse it are
    written together). The engine step writes it once its engine is spawned: ~1 ms off
    a cold start's path. ``keyed``: the planning step of this start compared the plan's
    key an instant ago (:mod:`lokid.unit.keptstart`), which is not done again."""
    from ..store import plancache

    found = plancache.reusable(runtime_dir, name, environ, keyed=keyed)
    if found is None:
        return None
    from ..core.launch.runtimeplan import RuntimePlan
    from ..planning.endpoint import check_listen_free
    from ..store.cleared import read_cleared
    from ..store.runtimedir import write_runtime_plan

    data, verdict = found
    try:
        rp = RuntimePlan.from_json(data)
    except ValueError:
        return None
    if rp.gpu_choice is not None:
        return None   # its GPUs are chosen anew at each start (lokid.planning.gpuchoice)
    from ..core.launch.portunit import marked_socket
    from ..core.record import replace

    if rp.socket != marked_socket(name, environ):
        return None   # planned where systemd held the port and not now, or the other way
    cleared = read_cleared(runtime_dir, name)
    check_workers((), rp.argv)   # before the token: a worker down is no failed launch
    token: Token | None = None
    later = False   # the runtime plan left for the caller to write
    if rp.spec_mode == "off" and not rp.auto and not verdict and cleared is None:
        # no speculation in this plan, nor any the attempt verdict could have cut: the
        # state DB has nothing to say (the start that recorded the plan settled it, and
        # any edit since changed the plan's key); 1 ms less on a cold start's path
        check_listen_free(rp.host, rp.port, rp.socket, runtime_dir)
        later = defer_write
        if not later:
            _stop.hold()
    else:
        from ..core.errors import StateError
        from ..store.state import StateDB

        try:
            with StateDB(state_dir) as db:
                now = db.peek(name, rp.mark, cleared=cleared)
                if now.why != verdict or now.record:
                    return None
                check_listen_free(rp.host, rp.port, rp.socket, runtime_dir)
                _stop.hold()  # as in _prestart: the token and its plan, both or neither
                token = _settle(db, runtime_dir, name, rp.mark, now, rp.auto, cleared)
        except StateError:
            return None
    rp = replace(rp, invocation=invocation, pid=os.getpid())
    if later:
        return rp, None, True
    write_runtime_plan(runtime_dir, rp)
    _stop.release()
    return rp, token, False


def _check_name(name: str) -> None:
    """ConfigError for a name that is no preset name nor one of its replicas' (``NAME:k``,
    :mod:`lokid.core.serve.replicas`; ``../x`` would name files outside the runtime directory)."""
    from ..core.serve.replicas import check_instance_name

    check_instance_name(name)


def _crash_loop(runtime_dir: str, name: str, under_systemd: bool) -> str:
    """Why this start must not run (the crash-loop rule), or ""."""
    import time

    from ..core.launch import crashloop
    from ..core.names import engine_unit
    from ..store import exits

    failures = exits.read_failures(runtime_dir, name)
    if not failures:
        return ""
    restarts = exits.automatic_restarts(engine_unit(name)) if under_systemd else 0
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


class _Stopped(BaseException):
    """SIGTERM reached the prestart step: systemd stops or restarts the unit. A
    BaseException, as KeyboardInterrupt is: no ``except Exception`` on the way takes it
    for a failure of what it interrupted."""


class _StopGuard:
    """SIGTERM in the prestart step ends it at once, and cleanly (exit 0): systemd
    counts a control process killed by its own SIGTERM as ``failed (signal)``, so a
    restart or a stop that lands while a start plans would leave the unit failed.
    Between :meth:`hold` and :meth:`release` (the attempt token set, the runtime plan
    that lets ``lokid stopped`` excuse it written) the stop waits. Inactive (no-ops)
    until :meth:`install`: ``lokid engine`` planning itself keeps the default."""

    def __init__(self) -> None:
        self.active = self.held = self.pending = False

    def install(self) -> None:
        import signal

        signal.signal(signal.SIGTERM, self._on_term)
        signal.signal(signal.SIGINT, self._on_term)
        self.active = True

    def _on_term(self, _signum: int, _frame: object) -> None:
        if self.held:
            self.pending = True
            return
        raise _Stopped

    def hold(self) -> None:
        self.held = self.active

    def release(self) -> None:
        self.held = False
        if self.pending:
            raise _Stopped


_stop = _StopGuard()


def prestart_step(config_dir: str, state_dir: str, runtime_dir: str, name: str) -> int:
    """ExecStartPre=: the crash-loop rule, then the plan of this start (the last ready
    start's when nothing it came from changed, else afresh), its attempt token settled
    and its runtime plan written; what ``lokid engine`` needs is left in the runtime
    directory (:mod:`lokid.store.handoff`). A start that must not run is logged and
    left there as refused, and the step exits 0 all the same: the engine step, the main
    process, says it as STATUS= and exits 78 or 69, which the unit does not restart.

    Without ``INVOCATION_ID`` (run by hand) it plans and writes the runtime plan, and a
    refusal is an error as in any other command."""
    from ..core.errors import LokiError
    from ..core.launch.crashloop import EXIT_CONFIG, EXIT_CRASH_LOOP, crashloop_message
    from ..store import exits, handoff

    invocation = os.environ.get("INVOCATION_ID", "")
    if not invocation:
        _check_name(name)
        prestart(config_dir, state_dir, runtime_dir, name)
        return 0
    try:
        _check_name(name)
    except LokiError:
        return 0  # no file named after it is written: `lokid engine` refuses it (78)
    _stop.install()
    try:
        unrecorded = exits.begin_start(runtime_dir, name, invocation)
        if unrecorded:   # the start before ended without its stop step (systemctl kill)
            journal_log(name, f"counted as a failure: {unrecorded}", priority=4)
        # systemd's start (INVOCATION_ID): ask it about NRestarts. Not by NOTIFY_SOCKET,
        # which a control process does not get under NotifyAccess=main.
        why = _crash_loop(runtime_dir, name, True)
        if why:
            left: handoff.Planned | handoff.Refused = handoff.Refused(
                EXIT_CRASH_LOOP, crashloop_message(name, why))
        else:
            left = _plan_start(config_dir, state_dir, runtime_dir, name, invocation)
        if isinstance(left, handoff.Refused):
            journal_log(name, left.message, priority=3 if left.status != handoff.PULL_FIRST else 5)
            handoff.write_refused(runtime_dir, name, invocation, left)
        else:
            handoff.write_planned(runtime_dir, name, invocation, left)
    except _Stopped:
        journal_log(name, "stopped while planning: a clean stop")
        return 0
    except OSError as e:  # the runtime directory: nothing can be handed over
        journal_log(name, f"cannot write to {runtime_dir}: {e}", priority=3)
        return EXIT_CONFIG
    return 0


def _plan_start(config_dir: str, state_dir: str, runtime_dir: str, name: str,
                invocation: str) -> handoff.Planned | handoff.Refused:
    """This start's plan, settled and written, or why it cannot start as it is."""
    import time

    from ..core.errors import LokiError, ModelNotPulledError
    from ..core.launch.crashloop import EXIT_CONFIG
    from ..store import handoff

    planned_at = time.time_ns()
    try:
        if _reuse(state_dir, runtime_dir, name, invocation, os.environ) is not None:
            return handoff.Planned([], "", 0)
        planned = _prestart(config_dir, state_dir, runtime_dir, name, log_notes=False)
    except WorkersDown as e:   # restarted by the unit: a worker may come back
        return handoff.Refused(EXIT_WORKERS, str(e))
    except ModelNotPulledError as e:   # the engine step pulls it (lokid.unit.pullfirst)
        return handoff.Refused(handoff.PULL_FIRST, str(e))
    except LokiError as e:
        return handoff.Refused(EXIT_CONFIG, str(e))
    from ..store.plancache import inputs_paths

    return handoff.Planned(inputs_paths(config_dir, planned.inputs, os.environ),
                           planned.verdict, planned_at)


def engine(config_dir: str, state_dir: str, runtime_dir: str, name: str,
           spawn: Callable[[list[str], dict[str, str]], Any] | None = None,
           pulled: bool = False) -> int:
    """Supervise the engine of this invocation, as its prestart step planned it (or plan
    first, when none ran: the local runner; or once its model is pulled: ``pulled``); the
    exit status for systemd. ``spawn``: how the engine starts (``supervisor.supervise``)."""
    from ..core.errors import LokiError, ModelNotPulledError
    from ..core.launch.crashloop import EXIT_CONFIG, EXIT_CRASH_LOOP, crashloop_message
    from ..host.notify import Notifier
    from ..store import handoff

    notifier = Notifier()
    invocation = os.environ.get("INVOCATION_ID", "")
    try:
        _check_name(name)  # before any file named after it is read
    except LokiError as e:
        notifier.send(f"STATUS={e}")
        journal_log("", str(e), priority=3)
        return EXIT_CONFIG
    left = handoff.read(runtime_dir, name, invocation)
    if isinstance(left, handoff.Refused) and left.status != handoff.PULL_FIRST:  # logged
        notifier.send(f"STATUS={left.message}")
        return left.status
    import time

    planned_at = time.time_ns()
    planned: _Planned | None = None
    token: Token | None = None
    unwritten = False   # the reused runtime plan, written once the engine is spawned
    try:
        kept = isinstance(left, handoff.Planned) and left.kept
        if isinstance(left, handoff.Planned) and not kept:
            rp = read_runtime_plan(runtime_dir, name, invocation)
        else:
            # planning here: no prestart step ran for this start (the local runner's), or
            # it found the kept plan standing (lokid.unit.keptstart): taken as the runner
            # takes it (its key not compared again), or planned afresh if it went since
            stop = "" if kept else _crash_loop(runtime_dir, name, notifier.enabled)
            if stop:
                message = crashloop_message(name, stop)
                notifier.send(f"STATUS={message}")
                journal_log(name, message, priority=3)
                return EXIT_CRASH_LOOP
            reused = _reuse(state_dir, runtime_dir, name, invocation, os.environ,
                            defer_write=True, keyed=kept)
            if reused is None:
                # the notes are logged once the engine is spawned: the journal's client
                # library loads while the engine does, not before it
                planned = _prestart(config_dir, state_dir, runtime_dir, name, log_notes=False)
                rp, token = planned.runtime, planned.token
            else:
                rp, token, unwritten = reused
        engine_env = rp.env
        if rp.secrets:  # the [secrets] variables: the engine's environment alone, never rp's
            from ..host.credentials import secret_env

            engine_env = {**rp.env, **secret_env(rp.secrets)}
    except LokiError as e:
        if isinstance(e, ModelNotPulledError) and not pulled:   # pulled first (issue 48)
            from .pullfirst import pull_first

            if (failed := pull_first(e, notifier, config_dir)) is None:
                return engine(config_dir, state_dir, runtime_dir, name, spawn, pulled=True)
            e = failed
        notifier.send(f"STATUS={e}")
        journal_log(name, str(e), priority=3)
        return EXIT_WORKERS if isinstance(e, WorkersDown) else EXIT_CONFIG
    from .supervisor import Launch, supervise

    launch = Launch.of(name, rp.argv, engine_env, rp.host, rp.port, rp.socket)
    from ..store.slotsizes import prepare_slot_dir

    prepare_slot_dir(name, rp.argv, runtime_dir)
    fresh = planned is not None or (isinstance(left, handoff.Planned) and bool(left.paths))
    how = "" if fresh else " (the last ready start's: nothing it was made from has changed)"
    from ..store.plancache import AHEAD

    if not fresh and AHEAD in rp.notes:
        how = " (planned ahead by the daemon: nothing it was made from has changed)"

    def on_spawned() -> None:
        # the reused plan left unwritten; or the prestart step's, which names the process
        # that supervises its engine (lokid plan's "loading"): this one, not the prestart
        if unwritten or isinstance(left, handoff.Planned):
            from ..core.record import replace
            from ..store.runtimedir import write_runtime_plan

            try:
                write_runtime_plan(runtime_dir, replace(rp, pid=os.getpid()))
            except OSError as e:
                journal_log(name, f"the runtime plan was not written: {e}", priority=4)

    def while_loading() -> None:
        _load_the_rest(planned_here=planned is not None, argv=rp.argv)
        _log_plan(name, rp.notes, rp.command_line(), how)   # shlex: once the engine runs
        if waited:
            journal_log(name, waited)

    def on_ready(url: str) -> None:
        from ..store import exits, plancache

        if rp.auto:
            clear_token(state_dir, runtime_dir, name, rp.mark, token, "ready")
        try:
            exits.mark_ready(runtime_dir, name, invocation)
            if planned is not None:
                plancache.record(runtime_dir, name,
                                 plancache.inputs_paths(config_dir, planned.inputs, os.environ),
                                 os.environ, rp, planned.verdict, planned_at)
            elif isinstance(left, handoff.Planned) and left.paths:
                plancache.record(runtime_dir, name, left.paths, os.environ, rp, left.verdict,
                                 left.planned_at)
        except (LokiError, OSError) as e:  # never a reason to stop a healthy engine
            journal_log(name, f"ready, but its state was not saved: {e}", priority=4)

    def log(message: str) -> None:
        journal_log(name, message)

    def refused() -> tuple[int, str] | None:
        """An engine that refuses its command line fails the same way at every try."""
        from .argcheck import argument_error

        line = argument_error(launch.argv, {**os.environ, **launch.env})
        if not line:
            return None
        message = (f"{os.path.basename(launch.argv[0])}: {line} (it refuses its command "
                   "line: fix the preset; restarting cannot help)")
        journal_log(name, message, priority=3)
        return EXIT_CONFIG, message

    from .held import held

    waited, refusal = held(runtime_dir, name, notifier)
    if refusal:
        return EXIT_CONFIG
    from .oncpu import watch  # the daemon's note that the engine runs on the CPU

    rc = supervise(launch, log=log, notifier=notifier, on_ready=on_ready,
                   on_spawned=on_spawned, while_loading=while_loading,
                   unexpected_exit_fails=True, refused=refused, spawn=spawn,
                   told=watch(runtime_dir, name, invocation, log))
    return workers_after_exit(name, launch.argv, rc, notifier)


def _load_the_rest(planned_here: bool, argv: Sequence[str] | None = None) -> None:
    """Import, while the engine loads, every module this step runs once the engine answers
    or exits (clearing the token, the ready mark, the plan cache, an engine's refusal, the
    RPC workers named: only when ``argv`` names some, or is not known yet). An upgrade
    while a model loads replaces lokid's files under this process, and a release may move
    modules: imported only at READY, they were gone, and a ready engine lost its token's
    clearing. Imported here, they are in memory whatever apt does next; the start does
    not wait for them (the engine loads meanwhile, or answers already)."""
    from ..core.errors import StateError  # noqa: F401
    from ..core.launch import crashloop  # noqa: F401
    from ..store import cleared, exits, plancache, state  # noqa: F401
    from . import argcheck  # noqa: F401

    if argv is None or names_workers(argv):
        from ..core.fleet import rpc  # noqa: F401
        from ..host import rpcprobe  # noqa: F401

    if planned_here:   # plancache.inputs_paths, for a plan this step made itself
        from ..core.config import files as config  # noqa: F401
        from ..host import probe  # noqa: F401


def stopped(state_dir: str, runtime_dir: str, name: str,
            environ: Mapping[str, str] | None = None) -> int:
    """ExecStopPost=: count a failure, or forgive an operator's stop while loading."""
    import time

    from ..core.errors import LokiError
    from ..core.launch.crashloop import Failure, exit_reason
    from ..store import exits

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
        exits.end_start(runtime_dir, name)   # said: the next start has nothing to count
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
    if clear_token(state_dir, runtime_dir, name, rp.mark, None, "stopped while loading"):
        journal_log(name, "stopped while loading: not counted against automatic "
                    "speculative decoding")
