"""What ``lokid plan`` shows: the plan the next start of a preset runs, read without
changing anything (the state DB is never created or written here; a start under way is
told apart by its runtime plan and its supervisor's process). Run by ``lokid plan``
(:mod:`lokid.cli`); it imports planning and store modules, as the steps do.
"""

from __future__ import annotations

from ..store.runtimedir import read_runtime_plan

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing
if TYPE_CHECKING:
    from collections.abc import Mapping

    from ..core.launch.plan import Plan, PlanInputs


def plan_now(config_dir: str, state_dir: str, runtime_dir: str, name: str,
             environ: Mapping[str, str] | None = None) -> Plan:
    """The plan the next start of ``name`` runs, as ``lokid plan`` shows it: the attempt
    verdict read from the state DB without changing it (the DB is never created or
    written here), and a token of a launch that is loading now shown as such.

    A state DB that cannot be read (damaged, or not readable by this user) is read as
    empty, said in a note (:class:`~lokid.store.state.StateReader`).
    """
    return plan_inputs_now(config_dir, state_dir, runtime_dir, name, environ)[0]


def plan_inputs_now(config_dir: str, state_dir: str, runtime_dir: str, name: str,
                    environ: Mapping[str, str] | None = None) -> tuple[Plan, PlanInputs]:
    """:func:`plan_now`, and the inputs it was made of (the model's header, the engine)."""
    from ..planning.gather import decide, gather
    from ..store.state import StateReader, read_cleared

    inputs = gather(config_dir, name, environ, for_unit=True, state_dir=state_dir)
    with StateReader(state_dir) as db:
        plan, _, _ = decide(inputs, db, loading=_loading(runtime_dir, name),
                            cleared=read_cleared(runtime_dir, name))
    return plan, inputs


def _loading(runtime_dir: str, name: str) -> bool:
    """Whether a start of ``name`` is under way and its engine has not answered yet: its
    runtime plan names a supervisor that still runs, and no READY is on record for it."""
    from ..core.errors import StalePlanError
    from ..store import exits

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
    # the local runner's spare step is told its preset on its input (lokid.unit.standby)
    return b"engine" in argv and (name.encode() in argv or b"-" in argv)


def replica_plans(config_dir: str, state_dir: str, runtime_dir: str, name: str,
                  count: int) -> list[tuple[int, Plan | str]]:
    """Each replica's plan past the first, up to ``count`` (the preset's
    ``max_replicas``), as ``lokid plan NAME`` shows them (:mod:`lokid.core.serve.replicas`):
    by index, the plan its next start would run, or why it cannot be planned (its port
    another preset's, say)."""
    from ..core.errors import LokiError
    from ..core.serve.replicas import instance
    from ..planning.gather import check_port_conflicts

    out: list[tuple[int, Plan | str]] = []
    for k in range(2, count + 1):
        try:
            plan = plan_now(config_dir, state_dir, runtime_dir, instance(name, k))
            check_port_conflicts(config_dir, plan, runtime_dir=runtime_dir)
        except LokiError as e:
            out.append((k, str(e)))
            continue
        out.append((k, plan))
    return out
