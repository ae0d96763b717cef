"""sd_notify(3) over ``$NOTIFY_SOCKET``: READY, STATUS, WATCHDOG and friends for systemd.

A datagram per call, as the protocol asks; silent when not run by systemd (no
``NOTIFY_SOCKET``), so the same code runs under ``lokid run``. The watchdog
interval is read from ``WATCHDOG_USEC`` when ``WATCHDOG_PID`` is ours (or unset).
Written here rather than taken from a library: it is a dozen lines, and
``lokid engine`` sits on the path to READY where every import counts.
"""

from __future__ import annotations

import os

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing; mypy knows the name
if TYPE_CHECKING:
    import socket
    from collections.abc import Mapping


class Notifier:
    """sd_notify over $NOTIFY_SOCKET; silent when not run by systemd."""

    def __init__(self, env: Mapping[str, str] | None = None):
        import socket

        env = os.environ if env is None else env
        address = env.get("NOTIFY_SOCKET", "")
        self._sock: socket.socket | None = None
        self._addr = ""
        if address:
            self._addr = "\0" + address[1:] if address.startswith("@") else address
            self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
        usec = env.get("WATCHDOG_USEC", "")
        pid = env.get("WATCHDOG_PID", "")
        self.watchdog_interval: float | None = None
        if usec.isdigit() and int(usec) > 0 and (not pid or pid == str(os.getpid())):
            self.watchdog_interval = int(usec) / 1e6

    @property
    def enabled(self) -> bool:
        return self._sock is not None

    def send(self, *fields: str) -> None:
        if self._sock is None:
            return
        try:
            self._sock.sendto("\n".join(fields).encode(), self._addr)
        except OSError:
            pass  # systemd gone (shutdown): nothing to tell

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
