"""The local runner's spare engine step: one ``lokid engine -`` started ahead of any start.

A start under the local runner spawned ``lokid engine <preset>``, a new interpreter that
took ~35 ms to be ready to spawn the engine (see :mod:`lokid.unit.standby`, the step's
side). :class:`Spare` keeps one such step started ahead, its modules imported, blocked
on its standard input; :meth:`Spare.take` hands it a start (the preset and the
invocation id, one line) and gives the runner the process and its output pipe, which it
then treats as the child it would have spawned. The spare is the daemon's child like any
step (the runner's exit statuses, signals and /proc walks hold), dies with it
(``LOKI_PARENT_PID``), and is replaced :data:`FILL_DELAY` seconds after the start it
served became ready or ended: its ~40 ms of CPU are not spent while an engine loads on
the same cores. A spare that is gone when asked (killed by hand, or it failed to start)
is not used: the start spawns its step as before, and a spare that died on its own is
not replaced until a start ends (no spawn loop).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import Callable, Sequence

log = logging.getLogger("lokid.local")

FILL_DELAY = 0.25        # seconds after a start became ready or ended
STANDBY = "-"            # lokid.unit.standby.STANDBY (not imported: the daemon needs none of it)
CLOSE_TIMEOUT = 10.0


class Spare:
    """At most one waiting step: ``argv`` + ``-``, with the environment ``env()`` gives."""

    def __init__(self, argv: Sequence[str], env: Callable[[], dict[str, str]]) -> None:
        self.argv = [*argv, STANDBY]
        self.env = env
        self.proc: asyncio.subprocess.Process | None = None
        self.stdin = -1        # our end of its standard input
        self.output = -1       # our end of its stdout and stderr (one pipe)
        self.timer: asyncio.TimerHandle | None = None
        self.filling: asyncio.Task[None] | None = None
        self.closed = False

    def fill_soon(self, delay: float = FILL_DELAY) -> None:
        """Start a spare in ``delay`` seconds, unless one is there or on its way."""
        if self.closed or self.proc is not None or self.timer is not None \
                or self.filling is not None:
            return
        self.timer = asyncio.get_running_loop().call_later(delay, self._fill)

    def _fill(self) -> None:
        self.timer = None
        self.filling = asyncio.get_running_loop().create_task(self.fill())

    async def fill(self) -> None:
        """Start the spare now."""
        stdin_r, stdin_w = os.pipe2(os.O_CLOEXEC)
        out_r, out_w = os.pipe2(os.O_CLOEXEC)
        try:
            proc = await asyncio.create_subprocess_exec(
                *self.argv, env=self.env(), stdin=stdin_r, stdout=out_w, stderr=out_w)
        except OSError as e:
            log.warning("no spare engine step: %s", e)
            os.close(stdin_w)
            os.close(out_r)
            return
        finally:
            os.close(stdin_r)
            os.close(out_w)
            self.filling = None
        self.proc, self.stdin, self.output = proc, stdin_w, out_r
        if self.closed:  # closed while it was being spawned
            await self.close()

    def take(self, preset: str, invocation: str
             ) -> tuple[asyncio.subprocess.Process, int] | None:
        """The spare, told to run ``preset``'s start ``invocation``, and the read end of
        its output (the caller's from now on); None when there is none to take."""
        proc = self.proc
        if proc is None:
            return None
        stdin, output = self.stdin, self.output
        self.proc, self.stdin, self.output = None, -1, -1
        try:
            if proc.returncode is not None:
                raise BrokenPipeError
            os.write(stdin, f"{preset} {invocation}\n".encode())
        except OSError:   # gone (EPIPE): the start spawns its own step
            log.warning("the spare engine step is gone (status %s): starting one for %s",
                        proc.returncode, preset)
            os.close(output)
            return None
        finally:
            os.close(stdin)
        return proc, output

    async def close(self) -> None:
        """No spare any more: the waiting one reads end of file and exits."""
        self.closed = True
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        if self.filling is not None:
            return   # fill() closes what it spawned once it sees closed
        proc = self.proc
        if proc is None:
            return
        os.close(self.stdin)
        os.close(self.output)
        self.proc, self.stdin, self.output = None, -1, -1
        try:
            await asyncio.wait_for(proc.wait(), CLOSE_TIMEOUT)
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            await proc.wait()
