"""The engine's port seen from outside: free before a start, answering ``/health`` after.

``check_port_free`` runs before any attempt token moves (``lokid prestart``,
``lokid run``): a second start refused because the first still loads must not
count as a failure. ``health_status`` is a raw HTTP/1.1 request on a socket: it
costs nothing to import and answers within milliseconds, which keeps lokid's
readiness overhead over the raw engine small (``benchmarks/readiness.py``).
"""

from __future__ import annotations

from ..core.address import reachable_host
from ..core.errors import PortBusyError


def check_port_free(host: str, port: int) -> None:
    """PortBusyError when something already listens on host:port."""
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
                raise PortBusyError(
                    f"port {port} on {host} is already in use by another process "
                    "(another engine? set port in the preset)"
                ) from None
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
