"""The engine started without ``subprocess``: ``posix_spawn``, and a handle that the
supervisor uses as it would use a ``subprocess.Popen``.

``subprocess`` costs its importer ~4 ms (threading, selectors, locale, contextlib...):
under systemd, in ``lokid engine``, before the engine spawns. Where nothing has to run
in the child between its fork and its exec (under systemd: no PR_SET_PDEATHSIG, the
unit's KillMode= takes the engine down), :func:`spawn` starts it with ``posix_spawn``
as ``subprocess.Popen(argv, env=env, stdin=DEVNULL, process_group=0)`` would: the
program looked up in ``env``'s PATH when its name has no slash, its own process group,
/dev/null as standard input, SIGPIPE and SIGXFSZ back to their default action (Python
ignores them; ``restore_signals``), an exec failure raised as OSError in the parent.
No descriptor is closed: Python opens its own non-inheritable (PEP 446), and a unit
passes its step none but 0, 1 and 2. The local runner's spare step execs its engine
in a child forked ahead (:class:`lokid.unit.standby.Launcher`) and hands back the same
:class:`Spawned`.
"""

from __future__ import annotations

import os
import signal

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing; mypy knows the name
if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

RESTORED = tuple(getattr(signal, s) for s in ("SIGPIPE", "SIGXFZ", "SIGXFSZ")
                 if hasattr(signal, s))


class Spawned:
    """A child process by its pid, as the supervisor uses a ``subprocess.Popen``."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.returncode: int | None = None

    def _reaped(self, status: int) -> int:
        self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def poll(self) -> int | None:
        if self.returncode is None:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                return self._reaped(status)
        return self.returncode

    def wait(self) -> int:
        if self.returncode is None:
            return self._reaped(os.waitpid(self.pid, 0)[1])
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.returncode is None:
            os.kill(self.pid, sig)


def _program(name: str, env: Mapping[str, str]) -> str:
    """``name`` as exec would find it in ``env``'s PATH (as subprocess looks it up); the
    name itself when it has a slash, or when no directory holds it (the spawn's ENOENT
    then names it)."""
    if "/" in name:
        return name
    for directory in os.get_exec_path(dict(env)):
        path = os.path.join(directory, name)
        if os.path.isfile(path) and os.access(path, os.X_OK):
            return path
    return name


def spawn(argv: Sequence[str], env: Mapping[str, str]) -> Spawned:
    """``argv`` started with ``env``, in its own process group, its input /dev/null."""
    pid = os.posix_spawn(_program(argv[0], env), list(argv), dict(env), setpgroup=0,
                         setsigdef=RESTORED,
                         file_actions=[(os.POSIX_SPAWN_OPEN, 0, os.devnull, os.O_RDONLY, 0)])
    return Spawned(pid)
