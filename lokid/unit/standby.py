"""The local runner's spare engine step: ``lokid engine -``, started ahead, told its preset later.

A cold start under the daemon's local runner waited for a new Python interpreter
(``lokid engine <preset>``): ~10 ms to start it and ~25 ms to import the step, before
the engine was even spawned, on a path that llama.cpp's router covers with one
``posix_spawn``. So the runner keeps one step started ahead (:mod:`lokid.runners.spare`):

- it imports, while nothing waits for it, every module a start runs (the step, the
  supervisor, the plan's reuse, what the step imports once the engine loads);
- it then blocks on its standard input for one line, ``<preset> <invocation id>``;
- told, it is that preset's ``lokid engine`` (the environment the runner gave it, the
  invocation id the runner chose for this start; standard input /dev/null again).
  End of file instead (the runner closed the pipe: it stops, or it replaced the spare)
  is a quiet exit.

Only a step told the daemon's pid (``LOKI_PARENT_PID``: the local runner's) waits so;
under systemd, ``lokid engine -`` is a preset name refused like any other bad one.
"""

from __future__ import annotations

import os

STANDBY = "-"          # `lokid engine -`: the preset is told on standard input
LINE_LIMIT = 4096


def preload() -> None:
    """Import what a start of an engine runs, so that nothing is imported once told."""
    from ..core import crashloop, errors, portunit, presetname, record, runtimeplan  # noqa: F401
    from ..host import journallog, notify, proc  # noqa: F401
    from ..planning import endpoint  # noqa: F401
    from ..store import handoff, plancache, runtimedir, state  # noqa: F401
    from . import steps, supervisor  # noqa: F401

    steps._load_the_rest(planned_here=False)
    import shlex  # noqa: F401  (the plan's command line, logged once the engine runs)


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
