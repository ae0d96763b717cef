"""``lokid run <preset>``: the engine in the foreground, no systemd needed.

Plan, check the port is free, start llama-server with the plan's argv and
environment (its output goes straight to our stdout/stderr), say "ready"
once ``/health`` answers 200, and on Ctrl-C or SIGTERM stop it cleanly. The
exit status is the engine's.
"""

from __future__ import annotations

import ctypes
import errno
import os
import shlex
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from typing import TextIO

import httpx

from .errors import EngineError, PortBusyError
from .plan import Plan

STOP_TIMEOUT = 30.0  # seconds between SIGTERM and SIGKILL
HEALTH_INTERVAL = 0.2


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


def health_url(host: str, port: int) -> str:
    """Where to ask for /health: a wildcard address is reached on loopback."""
    if host in ("0.0.0.0", ""):
        host = "127.0.0.1"
    elif host == "::":
        host = "::1"
    if ":" in host:
        host = f"[{host}]"
    return f"http://{host}:{port}"


def _die_with_parent() -> None:
    # The engine runs in its own process group (so Ctrl-C reaches lokid only,
    # which stops it once); PR_SET_PDEATHSIG keeps it from outliving a killed lokid.
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def engine_ready(url: str, client: httpx.Client) -> bool:
    try:
        return client.get(url + "/health").status_code == 200
    except httpx.HTTPError:
        return False


def run_plan(plan: Plan, out: TextIO = sys.stderr,
             on_ready: Callable[[str], None] | None = None) -> int:
    """Run the plan in the foreground; the engine's exit status (128+N for signal N)."""
    check_port_free(plan.host, plan.port)
    for note in plan.notes:
        print(f"lokid: note: {note}", file=out)
    added = " ".join(f"{k}={shlex.quote(v)}" for k, v in sorted(plan.env.items()))
    print(f"lokid: starting {added + ' ' if added else ''}{shlex.join(plan.argv)}", file=out,
          flush=True)

    stop_requested: list[int] = []

    def request_stop(signum: int, _frame: object) -> None:
        stop_requested.append(signum)

    old = {s: signal.signal(s, request_stop) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        try:
            proc = subprocess.Popen(
                list(plan.argv), env={**os.environ, **plan.env}, stdin=subprocess.DEVNULL,
                process_group=0, preexec_fn=_die_with_parent,
            )
        except OSError as e:
            raise EngineError(f"cannot start {plan.argv[0]}: {e.strerror}") from None
        url = health_url(plan.host, plan.port)
        ready = False
        stopping_since: float | None = None
        with httpx.Client(timeout=2.0) as client:
            while proc.poll() is None:
                if stop_requested and stopping_since is None:
                    print("lokid: stopping the engine", file=out, flush=True)
                    proc.send_signal(signal.SIGTERM)
                    stopping_since = time.monotonic()
                if stopping_since is not None:
                    if time.monotonic() - stopping_since > STOP_TIMEOUT:
                        print(f"lokid: the engine ignored SIGTERM for {STOP_TIMEOUT:.0f} s: "
                              "killing it", file=out, flush=True)
                        proc.kill()
                elif not ready and engine_ready(url, client):
                    ready = True
                    print(f"lokid: ready at {url}", file=out, flush=True)
                    if on_ready is not None:
                        on_ready(url)
                time.sleep(HEALTH_INTERVAL)
        rc = proc.wait()
    finally:
        for s, handler in old.items():
            signal.signal(s, handler)
    if rc < 0:
        rc = 128 - rc
    if stopping_since is None:
        print(f"lokid: the engine exited with status {rc}"
              + ("" if ready else " before it was ready"), file=out, flush=True)
    return rc
