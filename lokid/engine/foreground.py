"""``lokid run <preset>``: the engine in the foreground, no systemd needed.

Plan, check the port is free, then the same supervisor as the unit's
``lokid engine`` (:mod:`lokid.engine.supervisor`): the engine's output goes straight
to our stdout/stderr, "ready" is printed with the URL once ``/health``
answers 200, Ctrl-C or SIGTERM stop it cleanly, and the exit status is the
engine's.
"""

from __future__ import annotations

import errno
import shlex
import socket
import sys
from collections.abc import Callable
from typing import TextIO

from ..core.errors import PortBusyError
from ..core.plan import Plan
from .supervisor import Launch, supervise


def check_port_free(host: str, port: int) -> None:
    """PortBusyError when something already listens on host:port."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        # SO_REUSEADDR: a port in TIME_WAIT after a previous engine is free.
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError as e:
            if e.errno == errno.EADDRINUSE:
                raise PortBusyError(
                    f"port {port} on {host} is already in use by another process "
                    "(another engine? set port in the preset)"
                ) from None
            if e.errno == errno.EADDRNOTAVAIL:
                raise PortBusyError(f"cannot listen on {host}: no such local address") from None
            raise


def describe(plan: Plan) -> str:
    added = " ".join(f"{k}={shlex.quote(v)}" for k, v in sorted(plan.env.items()))
    return (added + " " if added else "") + shlex.join(plan.argv)


def run_plan(plan: Plan, out: TextIO = sys.stderr,
             on_ready: Callable[[str], None] | None = None) -> int:
    """Run the plan in the foreground; the engine's exit status (128+N for signal N)."""
    check_port_free(plan.host, plan.port)
    for note in plan.notes:
        print(f"lokid: note: {note}", file=out)
    print(f"lokid: starting {describe(plan)}", file=out, flush=True)

    def log(message: str) -> None:
        print(f"lokid: {message}", file=out, flush=True)

    launch = Launch.of(plan.preset, plan.argv, plan.env, plan.host, plan.port)
    return supervise(launch, log=log, on_ready=on_ready)
