"""``lokid run <preset>``: the engine in the foreground, no systemd needed.

Plan, check the port is free, then the same supervisor as the unit's
``lokid engine`` (:mod:`lokid.unit.supervisor`): the engine's output goes straight
to our stdout/stderr, "ready" is printed with the URL once ``/health``
answers 200, Ctrl-C or SIGTERM stop it cleanly, and the exit status is the
engine's.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import TextIO

from ..core import paths
from ..core.launch.conflicts import ListenSource
from ..core.launch.plan import Plan
from ..host.journallog import say
from ..planning.endpoint import check_listen_free
from .supervisor import Launch, supervise


def run_plan(plan: Plan, out: TextIO = sys.stderr,
             on_ready: Callable[[str], None] | None = None,
             source: ListenSource | None = None) -> int:
    """Run the plan in the foreground; the engine's exit status (128+N for signal N).

    ``source``: the files that set the plan's host and port, for the error when the
    engine could not listen there (:func:`lokid.core.launch.conflicts.listen_source`)."""
    check_listen_free(plan.host, plan.port, plan.socket, paths.runtime_dir(), source)
    for note in plan.notes:
        say(f"note: {note}", out)
    say(f"starting {plan.command_line()}", out)

    def log(message: str) -> None:
        say(message, out)

    from ..host.credentials import secret_env

    env = {**plan.env, **secret_env(plan.secrets)}   # the engine's alone: never printed
    launch = Launch.of(plan.preset, plan.argv, env, plan.host, plan.port, plan.socket)
    return supervise(launch, log=log, on_ready=on_ready)
