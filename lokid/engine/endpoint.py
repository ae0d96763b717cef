"""The engine's port seen from outside: free before a start, answering ``/health`` after.

``check_port_free`` runs before any attempt token moves (``lokid prestart``,
``lokid run``): a second start refused because the first still loads must not
count as a failure. A busy port is reported with who holds it: the preset whose
runtime plan has the port, or the listening process found through ``/proc``
(:func:`lokid.core.conflicts.holder` decides; the files are read only once
the bind has failed).

``health_status`` is a raw HTTP/1.1 request on a socket: it costs nothing to
import and answers within milliseconds, which keeps lokid's readiness overhead
over the raw engine small (``benchmarks/readiness.py``).
"""

from __future__ import annotations

import os

from ..core.address import reachable_host
from ..core.errors import PortBusyError


def _holder(host: str, port: int, runtime_dir: str | None) -> str:
    """Who holds the port, best effort (what this user may see of /proc and the
    runtime directory)."""
    import pwd

    from ..core.conflicts import holder
    from ..core.errors import StalePlanError
    from .proc import cmdline, command_name, pid_listening_on
    from .runtimedir import RUNTIME_SUFFIX, read_runtime_plan

    plans = []
    if runtime_dir:
        try:
            names = sorted(os.listdir(runtime_dir))
        except OSError:         # not there yet, or not ours to read (/run/loki is 0750)
            names = []
        for entry in names:
            if entry.endswith(RUNTIME_SUFFIX) and not entry.startswith("."):
                try:
                    plans.append(read_runtime_plan(runtime_dir, entry[:-len(RUNTIME_SUFFIX)]))
                except StalePlanError:
                    continue
    pid = pid_listening_on(port)
    try:
        user = pwd.getpwuid(os.geteuid()).pw_name
    except KeyError:
        user = str(os.geteuid())
    return holder(host, port, plans, pid, None if pid is None else cmdline(pid),
                  None if pid is None else command_name(pid), user)


def check_port_free(host: str, port: int, runtime_dir: str | None = None) -> None:
    """PortBusyError when something already listens on host:port, naming who: a preset
    whose runtime plan in ``runtime_dir`` has the port, or the process."""
    import errno
    import socket

    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        # SO_REUSEADDR: a port in TIME_WAIT after a previous engine is free.
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError as e:
            if e.errno == errno.EADDRINUSE:
                raise PortBusyError(f"port {port} on {host} is already in use by "
                                    f"{_holder(host, port, runtime_dir)}") from None
            if e.errno == errno.EADDRNOTAVAIL:
                raise PortBusyError(f"cannot listen on {host}: no such local address") from None
            raise


def health_status(host: str, port: int, timeout: float = 1.0) -> int | None:
    """HTTP status of GET /health, or None when nothing answers."""
    import socket

    try:
        with socket.create_connection((reachable_host(host), port), timeout=timeout) as s:
            s.sendall(b"GET /health HTTP/1.1\r\nHost: lokid\r\nConnection: close\r\n\r\n")
            head = s.recv(64)
    except OSError:
        return None
    parts = head.split(b" ", 2)
    if len(parts) >= 2 and parts[0].startswith(b"HTTP/") and parts[1].isdigit():
        return int(parts[1])
    return None
