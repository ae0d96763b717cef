"""The local runner's spare engine step: ``lokid engine -``, started ahead, told its preset later.

A cold start under the daemon's local runner waited for a new Python interpreter
(``lokid engine <preset>``): ~10 ms to start it and ~25 ms to import the step, before
the engine was even spawned, on a path that llama.cpp's router covers with one
``posix_spawn``. So the runner keeps one step started ahead (:mod:`lokid.runners.spare`):

- it imports, while nothing waits for it, every module a start runs (the step, the
  supervisor, the plan's reuse, what the step imports once the engine loads);
- it then blocks on its standard input for one line, ``<preset> <invocation id>``;
- told, it is that preset's ``lokid engine`` (the environment the runner gave it, the
  invocation id the runner chose for this start; standard input /dev/null again),
  and its engine is exec'd by a child it forked while it waited (:class:`Launcher`).
  End of file instead (the runner closed the pipe: it stops, or it replaced the spare)
  is a quiet exit.

Only a step told the daemon's pid (``LOKI_PARENT_PID``: the local runner's) waits so;
under systemd, ``lokid engine -`` is a preset name refused like any other bad one.
"""

from __future__ import annotations

import os

from ..host.spawn import RESTORED, Spawned

STANDBY = "-"          # `lokid engine -`: the preset is told on standard input
LINE_LIMIT = 4096


def preload() -> None:
    """Import what a start of an engine runs, so that nothing is imported once told."""
    from ..core import errors, record  # noqa: F401
    from ..core.config import presetname  # noqa: F401
    from ..core.launch import crashloop, portunit, runtimeplan  # noqa: F401
    from ..host import gone, journallog, notify, proc  # noqa: F401
    from ..planning import endpoint  # noqa: F401
    from ..store import handoff, holds, plancache, runtimedir, state  # noqa: F401
    from . import held, steps, supervisor  # noqa: F401

    steps._load_the_rest(planned_here=False)
    import select  # noqa: F401  (host.gone's, for a start that waits for its group's stops)
    import shlex  # noqa: F401  (the plan's command line, logged once the engine runs)

    import sdnotify  # noqa: F401  (host.notify's, imported when the step makes its notifier)

    # Two lookups made once per process, and so once per start, on its path: the reuse
    # key's SHA-256 constructor, before the spawn (~0.3 ms: on 3.11 the import of 3.12's
    # module name fails after a search of the whole path), and the codec getaddrinfo()
    # encodes a host name with, at the first /health poll (~1 ms of imports, the CPU
    # taken from the engine's load on a 2-CPU machine).
    plancache._sha256(b"")
    import encodings.idna  # noqa: F401


def told(fd: int = 0) -> str | None:
    """Wait for the line that names this start; set its ``INVOCATION_ID``; the preset
    name (checked by the step, as any other), or None at end of file."""
    data = b""
    while b"\n" not in data and len(data) < LINE_LIMIT:
        try:
            chunk = os.read(fd, LINE_LIMIT)
        except InterruptedError:
            continue
        if not chunk:
            return None
        data += chunk
    line = data.split(b"\n", 1)[0].decode("utf-8", "replace")
    preset, _, invocation = line.partition(" ")
    os.environ["INVOCATION_ID"] = invocation
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, fd)
    os.close(null)
    return preset


class Launcher:
    """A child forked ahead, waiting to become the engine. Its process group and its
    PR_SET_PDEATHSIG (SIGKILL when this step dies: the engine never outlives it) are set
    while nothing waits; told the command line, it only execs. The same start through
    ``subprocess`` forks the step with a ``preexec_fn`` (no vfork then): ~1.5 ms more,
    on a cold start's path. Forked while the spare is single-threaded."""

    def __init__(self) -> None:
        parent = os.getpid()
        told_r, self.told = os.pipe2(os.O_CLOEXEC)
        self.failed, failed_w = os.pipe2(os.O_CLOEXEC)
        self.pid = os.fork()
        if self.pid == 0:   # pragma: no cover (the child; its exec ends this code)
            os.close(self.told)     # the parent's ends: the child's read sees EOF once
            os.close(self.failed)   # the parent closed its own
            _become_the_engine(told_r, failed_w, parent)
        os.close(told_r)
        os.close(failed_w)

    def spawn(self, argv: list[str], env: dict[str, str]) -> Spawned:
        """The engine, exec'd in the child with ``env``; OSError as ``subprocess`` raises
        it when the exec failed (no such file, not executable)."""
        import json

        data = json.dumps([argv, env]).encode()   # ASCII: lone surrogates as \\udcXX
        try:
            while data:
                data = data[os.write(self.told, data):]
        finally:
            os.close(self.told)
        failure = b""
        while chunk := os.read(self.failed, 64):   # EOF: the exec closed its end
            failure += chunk
        os.close(self.failed)
        if failure:
            os.waitpid(self.pid, 0)
            errno = int(failure)
            raise OSError(errno, os.strerror(errno), argv[0])
        return Spawned(self.pid)

    def close(self) -> None:
        """Not needed (the start was refused before its spawn): the child exits."""
        for fd in (self.told, self.failed):
            try:
                os.close(fd)
            except OSError:
                pass
        try:
            os.waitpid(self.pid, 0)
        except ChildProcessError:
            pass


def _become_the_engine(told: int, failed: int, parent: int) -> None:
    """The launcher's child: its own process group, death with its parent, /dev/null as
    input (the spare's is the runner's pipe), the signals Python ignores restored, then
    the command line it is told, exec'd; status 0 when told nothing, 127 on a failure.
    All of it but the exec is done while the spare waits, off a start's path."""
    import signal

    from ..host.proc import guard_self

    status = 127
    try:
        os.setpgid(0, 0)
        if not guard_self(parent, signal.SIGKILL):
            os._exit(0)   # the spare died before the guard was set
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.close(null)
        for sig in RESTORED:   # as subprocess's restore_signals
            signal.signal(sig, signal.SIG_DFL)
        data = b""
        while chunk := os.read(told, 1 << 16):
            data += chunk
        if not data:
            os._exit(0)
        import json

        argv, env = json.loads(data)
        os.execvpe(argv[0], argv, env)
    except OSError as e:
        try:
            os.write(failed, str(e.errno or 0).encode())
        except OSError:
            pass
    except BaseException:   # nothing of Python's teardown in a forked child
        pass
    os._exit(status)
