"""A runner's job ended: the ``JobFinished`` signal, with the state it left and why.

A failed start quotes the engine's own last error line rather than the last status
line (often the load's progress, stale by then). Under systemd that line reaches
the daemon through the journal, by another path than the job's end: the journal
is read for it, a moment at most, before ``JobFinished`` goes out without it. A start
that ran out of memory says so first, with what failed and what was free (issue 45,
item 13: its clients read the load's last progress line instead).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine
from typing import Any, Protocol

from ..core.telemetry.lasterror import LastErrors
from ..runners.runner import JOB_FAILED, EngineState

log = logging.getLogger("lokid.daemon")  # the daemon's own lines, as they always were

# A failed start's last engine line may reach the journal after systemd ended the job:
# it is looked for this many times, this far apart, before JobFinished goes without it.
JOURNAL_LAG_TRIES = 5
JOURNAL_LAG_STEP = 0.1


class Journal(Protocol):
    def drain(self) -> Any: ...


class JobHost(Protocol):
    """What the reports need of the daemon."""

    last_errors: LastErrors
    watcher: Any      # a Journal, or None without one (the local runner)
    # its footprints' out_of_memory(name): how the preset's start ran out of memory, ""
    # when it did not (lokid.dbus.footprints.Footprints)
    telemetry: Any

    def engine_state(self, name: str) -> EngineState: ...


class JobReports:
    def __init__(self, host: JobHost,
                 spawn: Callable[[Coroutine[Any, Any, Any], str], Any],
                 emit: Callable[[str, str, str, str, str, str], None]):
        self.host = host
        self.spawn = spawn
        self.emit = emit    # JobFinished(preset, job, verb, result, state, detail)

    def on_job(self, name: str, job: str, verb: str, result: str) -> None:
        state = self.host.engine_state(name)
        if result == JOB_FAILED and not self.host.last_errors.of(name) \
                and self.host.watcher is not None:
            self.spawn(self._failed(name, job, verb, result, state),
                       f"reporting the failed {verb} of preset {name}")
            return
        self._finished(name, job, verb, result, state)

    async def _failed(self, name: str, job: str, verb: str, result: str,
                      state: EngineState) -> None:
        for _ in range(JOURNAL_LAG_TRIES):
            watcher = self.host.watcher
            if watcher is None or self.host.last_errors.of(name):
                break
            try:
                watcher.drain()
            except OSError as e:
                log.warning("reading the journal: %s", e)
                break
            if not self.host.last_errors.of(name):
                await asyncio.sleep(JOURNAL_LAG_STEP)
        self._finished(name, job, verb, result, state)

    def _finished(self, name: str, job: str, verb: str, result: str,
                  state: EngineState) -> None:
        detail = state.detail
        said = self.host.last_errors.of(name) if result == JOB_FAILED else ""
        said = "" if said in detail else said   # lokid's reason quotes it already
        # the engine's own words replace a status line that was only the load's progress
        status = f"the engine said: {said}" if said else state.status
        if status and status not in detail and (result != "done" or state.state != "ready"):
            detail = f"{detail}: {status}" if detail else status
        # a start out of memory says so first: the engine's last line was only "exiting
        # due to model loading error", or none yet (issue 45, item 13); its restart is
        # cancelled (lokid.dbus.footprints)
        oom = self.host.telemetry.footprints.out_of_memory(name) if result == JOB_FAILED \
            else ""
        if oom:
            detail = f"out of memory ({oom})" + (f"; the engine said: {said}" if said else "")
        if result != "done":
            log.info("preset %s: the %s job ended: %s%s", name, verb, result,
                     f" ({detail})" if detail else "")
        self.emit(name, job, verb, result, state.state, detail)
