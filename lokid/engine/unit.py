"""The helpers ``loki-engine@.service`` runs: ``lokid prestart`` and ``lokid engine``.

``prestart`` (ExecStartPre) plans the launch, refuses a busy port before
touching any attempt token (peek, then settle), writes the plan of this
invocation to ``$LOKI_RUNTIME_DIR/<preset>.json`` (:mod:`lokid.engine.runtimedir`) and
logs each note as its own journal entry. ``engine`` (ExecStart) reads that
plan and supervises llama-server (:mod:`lokid.engine.supervisor`); on READY it
clears its own attempt token, so the next start of the same configuration
is allowed again.

``engine`` is on the path from ``systemctl start`` to READY: its imports
are the few it needs, prestart's (config, GGUF and engine probes, the plan)
stay inside prestart.
"""

from __future__ import annotations

import os

from .runtimedir import journal_log, read_runtime_plan, write_runtime_plan

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing; mypy knows the name
if TYPE_CHECKING:
    from collections.abc import Mapping

    from ..core.attempt import Mark, Verdict
    from ..core.plan import Plan, PlanInputs
    from .state import StateDB


def decide(inputs: PlanInputs, db: StateDB) -> tuple[Plan, Mark, Verdict]:
    """The plan of a start, given the attempt verdict for its mark (read-only on ``db``).

    The mark is the plan's as it would be with automatic speculation allowed, so
    that a cut configuration keeps the same mark.
    """
    from dataclasses import replace

    from ..core.attempt import Mark
    from ..core.plan import build_plan, fingerprint

    allowed = build_plan(inputs)
    mark = Mark(fingerprint(allowed, inputs.model), inputs.caps.path, inputs.caps.build)
    found = db.peek(inputs.preset.name, mark)
    plan = build_plan(replace(inputs, auto_blocked=found.why)) if found.why else allowed
    return plan, mark, found


def prestart(config_dir: str, state_dir: str, runtime_dir: str, name: str,
             environ: Mapping[str, str] | None = None) -> Plan:
    """Plan the launch of ``name``, settle its attempt token, write the runtime plan."""
    from .foreground import check_port_free, describe
    from .gather import gather
    from .state import StateDB

    environ = dict(os.environ if environ is None else environ)
    inputs = gather(config_dir, name, environ)
    with StateDB(state_dir) as db:
        plan, mark, found = decide(inputs, db)
        # Before any token moves: a second start refused because the first is
        # still loading must not count the first one's token as a failure.
        check_port_free(plan.host, plan.port)
        db.settle(name, mark, found, attempt=plan.spec.auto)
    write_runtime_plan(runtime_dir, name, {
        **plan.to_json(),
        "host": plan.host,
        "port": plan.port,
        "mark": {"fingerprint": mark.fingerprint, "engine": mark.engine, "build": mark.build},
        "invocation": environ.get("INVOCATION_ID", ""),
    })
    for note in plan.notes:
        journal_log(name, note)
    journal_log(name, f"plan: {describe(plan)}", priority=6)
    return plan


def engine(state_dir: str, runtime_dir: str, name: str) -> int:
    """Supervise the engine of this invocation; the exit status for systemd."""
    rp = read_runtime_plan(runtime_dir, name, os.environ.get("INVOCATION_ID"))
    from .supervisor import Launch, supervise

    launch = Launch.of(name, rp.plan["argv"], rp.plan["env"], rp.host, rp.port)

    def on_ready(url: str) -> None:
        if rp.auto:
            from .state import StateDB

            with StateDB(state_dir) as db:
                db.clear(name, rp.mark)

    def log(message: str) -> None:
        journal_log(name, message)

    return supervise(launch, log=log, on_ready=on_ready, unexpected_exit_fails=True)
