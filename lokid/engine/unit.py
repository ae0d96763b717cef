"""The helpers ``loki-engine@.service`` runs: ``lokid prestart`` and ``lokid engine``.

``prestart`` (ExecStartPre) plans the launch, refuses a busy port before
touching any attempt token (peek, then settle), writes the plan of this
invocation (:class:`lokid.core.runtimeplan.RuntimePlan`) to
``$LOKI_RUNTIME_DIR/<preset>.json`` and
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

from .journallog import journal_log
from .runtimedir import read_runtime_plan

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing; mypy knows the name
if TYPE_CHECKING:
    from collections.abc import Mapping

    from ..core.plan import Plan


def prestart(config_dir: str, state_dir: str, runtime_dir: str, name: str,
             environ: Mapping[str, str] | None = None) -> Plan:
    """Plan the launch of ``name``, settle its attempt token, write the runtime plan."""
    from ..core.runtimeplan import RuntimePlan
    from .endpoint import check_port_free
    from .gather import decide, gather
    from .runtimedir import write_runtime_plan
    from .state import StateDB

    environ = dict(os.environ if environ is None else environ)
    inputs = gather(config_dir, name, environ)
    with StateDB(state_dir) as db:
        plan, mark, found = decide(inputs, db)
        # Before any token moves: a second start refused because the first is
        # still loading must not count the first one's token as a failure.
        check_port_free(plan.host, plan.port)
        db.settle(name, mark, found, attempt=plan.spec.auto)
    write_runtime_plan(runtime_dir, RuntimePlan.of(plan, mark, environ.get("INVOCATION_ID", "")))
    for note in plan.notes:
        journal_log(name, note)
    journal_log(name, f"plan: {plan.command_line()}", priority=6)
    return plan


def engine(state_dir: str, runtime_dir: str, name: str) -> int:
    """Supervise the engine of this invocation; the exit status for systemd."""
    rp = read_runtime_plan(runtime_dir, name, os.environ.get("INVOCATION_ID"))
    from .supervisor import Launch, supervise

    launch = Launch.of(name, rp.argv, rp.env, rp.host, rp.port)

    def on_ready(url: str) -> None:
        if rp.auto:
            from .state import StateDB

            with StateDB(state_dir) as db:
                db.clear(name, rp.mark)

    def log(message: str) -> None:
        journal_log(name, message)

    return supervise(launch, log=log, on_ready=on_ready, unexpected_exit_fails=True)
