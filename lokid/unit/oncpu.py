"""What ``lokid engine`` does with the daemon's note that its engine runs on the CPU
(issue 44, item 3; the note is :mod:`lokid.store.oncpunote`).

The supervisor asks :func:`watch`'s callable once a second while its engine serves
(:func:`lokid.unit.supervisor.supervise`'s ``told``), until it answers once:

- the preset lets such a start run: the unit's STATUS= keeps its ready line and says
  "running on the CPU: <reason>", so ``systemctl status`` says what ``lokictl top`` says;
  the engine serves on;
- the preset says ``cpu_fallback = "fail"``: the engine is stopped and the step exits
  :data:`~lokid.core.launch.crashloop.EXIT_CONFIG` with the reason as its STATUS=. The unit
  ends *failed*, saying why, and is not restarted (``RestartPreventExitStatus=``; a
  restart would find the same GPU missing); the daemon stopping it instead left it
  "inactive", as if an operator had. A start by hand tries again.

Either way the step says it once in the unit's own journal (the daemon's entry is in
lokid.service's). Asking costs one failed ``open`` a second while there is no note.
"""

from __future__ import annotations

from ..core.launch.crashloop import EXIT_CONFIG
from ..store.oncpunote import take_note

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing; mypy knows the name
if TYPE_CHECKING:
    from collections.abc import Callable


class Told:
    """What the supervisor is told about its serving engine: ``line`` for STATUS= (after
    the ready line while it serves on), ``status`` 0 to serve on, else the exit status
    that ends the start once the engine is stopped (``line`` alone as STATUS= then)."""

    __slots__ = ("line", "status")

    def __init__(self, line: str, status: int = 0):
        self.line = line
        self.status = status


def watch(runtime_dir: str, preset: str, invocation: str,
          log: Callable[[str], None]) -> Callable[[], Told | None]:
    """The supervisor's question for this start: None until the daemon's note for it is
    there, then what it says (``log``: the unit's journal line)."""

    def told() -> Told | None:
        note = take_note(runtime_dir, preset, invocation)
        if note is None:
            return None
        if note.fail:
            line = (f"stopped: the engine runs on the CPU: {note.reason} (the preset says "
                    "cpu_fallback = \"fail\"; a start by hand tries again)")
            log(line)
            return Told(line, EXIT_CONFIG)
        log(f"the engine runs on the CPU: {note.reason} (cpu_fallback = \"fail\" in the "
            "preset stops such a start)")
        return Told(f"running on the CPU: {note.reason}")

    return told
