"""sd_notify(3) for systemd: READY, STATUS, WATCHDOG, EXTEND_TIMEOUT_USEC and STOPPING.

The datagrams go through ``sdnotify`` (Debian ``python3-sdnotify``, one small
module of socket and os: it costs ``lokid engine`` well under a millisecond
before the engine spawns). This module adds what ``sdnotify`` leaves to its
callers:

- silence without systemd: no socket at all when ``NOTIFY_SOCKET`` is unset,
  so the same code runs under ``lokid run``, and :attr:`Notifier.enabled`
  says which case this is;
- the watchdog interval, from ``WATCHDOG_USEC`` when ``WATCHDOG_PID`` is ours
  (or unset);
- UTF-8: ``sdnotify`` encodes a message as Latin-1 and drops, silently, one
  that does not fit, such as a STATUS= naming a preset file ``modèle-日本.toml``.
  The message is handed over as the Latin-1 reading of its UTF-8 bytes, which
  ``sdnotify`` turns back into exactly those bytes: what systemd expects.
"""

from __future__ import annotations

import os

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing; mypy knows the name
if TYPE_CHECKING:
    from sdnotify import SystemdNotifier


class Notifier:
    """sd_notify over this process's $NOTIFY_SOCKET; silent when not run by systemd."""

    def __init__(self) -> None:
        env = os.environ  # sdnotify reads NOTIFY_SOCKET there, so the rest is read there too
        self._sd: SystemdNotifier | None = None
        if env.get("NOTIFY_SOCKET", ""):
            from sdnotify import SystemdNotifier

            sd = SystemdNotifier()  # its socket is None when it could not connect
            self._sd = sd if sd.socket is not None else None
        usec = env.get("WATCHDOG_USEC", "")
        pid = env.get("WATCHDOG_PID", "")
        self.watchdog_interval: float | None = None
        if usec.isdigit() and int(usec) > 0 and (not pid or pid == str(os.getpid())):
            self.watchdog_interval = int(usec) / 1e6

    @property
    def enabled(self) -> bool:
        return self._sd is not None

    def send(self, *fields: str) -> None:
        """One datagram of ``fields``, one per line; a systemd that is gone (shutdown)
        is nobody to tell, and sdnotify says nothing of it."""
        if self._sd is not None:
            self._sd.notify("\n".join(fields).encode().decode("latin-1"))

    def close(self) -> None:
        if self._sd is not None:
            self._sd.socket.close()
            self._sd = None
