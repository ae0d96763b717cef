"""A start whose GPU engine runs on the CPU, as the daemon acts on it (issue 44, item 3).

The journal watcher (or the local runner's judge) finds it at the start's "ready at"
(:meth:`lokid.core.telemetry.enginelog.Load.on_cpu`: a GPU backend that did not start, or
"offloaded" with every buffer in host memory) and writes lokid's own journal entry;
the Stats carry it as ``on_cpu`` (:mod:`lokid.core.telemetry.figures`). Here the daemon says it
in its own log and tells the start, through a note in the runtime directory
(:mod:`lokid.store.oncpunote`), which its engine step reads while the engine serves
(:mod:`lokid.unit.oncpu`): the only process that may set the unit's STATUS= says there
that the engine runs on the CPU, and, where the preset says ``cpu_fallback = "fail"``,
stops it and ends the unit *failed* with that reason as its status (not restarted: the
next start would find the same GPU missing). An operator who would rather have no engine
than one 10-100x slower gets no engine, and ``systemctl status`` says why.

Where the note cannot be written, or is still there :data:`GRACE` seconds later while
the same start runs (an engine step of a release before notes, or one that cannot read
it), a ``fail`` preset's engine is stopped through the runner as the operator's own stop
would (it ends "inactive" then, and the daemon's log says why). A defect here is one log
line: never a reason to stop an engine the preset lets run.
"""

from __future__ import annotations

import asyncio
import logging
import os
from typing import Any, Protocol

from ..core.errors import StalePlanError
from ..core.serve.replicas import preset_of
from ..runners.runner import LIVE
from ..store.oncpunote import Note, read_note, write_note
from ..store.runtimedir import read_runtime_plan

log = logging.getLogger("lokid.daemon")

GRACE = 10.0   # seconds an engine step has to take its note (it looks once a second)


class Host(Protocol):
    """What this reads of the daemon: the presets as read (each view's ``cpu_fallback``),
    the runtime directory, and the runner that stops an engine."""

    registry: Any
    runtime_dir: str

    @property
    def runner(self) -> Any: ...


class OnCpu:
    """Called with each start found running on the CPU (an ``AutoCut``'s shape: preset,
    invocation, reason)."""

    def __init__(self, host: Host, grace: float = GRACE):
        self.host = host
        self.grace = grace
        self.stops: set[asyncio.Task[None]] = set()
        self.stopped: list[str] = []   # the presets the daemon stopped itself (the tests')

    def __call__(self, found: Any) -> None:
        name, why, invocation = found.preset, found.reason, found.invocation
        # a replica (NAME:k) runs its preset's cpu_fallback: read by its own name, none
        # was found and a "fail" preset's replicas ran on the CPU (issue 47)
        view = self.host.registry.presets.get(preset_of(name))
        fail = view is not None and getattr(view, "cpu_fallback", "run") == "fail"
        log.warning("preset %s: its engine runs on the CPU: %s%s", name, why,
                    "; stopped, as its cpu_fallback = \"fail\" says" if fail else
                    " (cpu_fallback = \"fail\" in the preset stops such a start)")
        told = self._tell(name, Note(invocation, fail, why))
        runner = self.host.runner
        if not fail or runner is None:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:   # no loop: a caller outside the daemon
            return
        task = loop.create_task(self._stop(runner, name, invocation, 0.0 if not told
                                           else self.grace))
        self.stops.add(task)
        task.add_done_callback(self.stops.discard)

    def _tell(self, name: str, note: Note) -> bool:
        """Leave the note for the start; whether it was written."""
        runtime_dir = self.host.runtime_dir
        try:
            st = os.stat(runtime_dir)
            write_note(runtime_dir, name, note,
                       (st.st_uid, st.st_gid) if os.geteuid() == 0 else None)
        except (OSError, ValueError) as e:
            log.warning("preset %s: its engine's unit was not told it runs on the CPU "
                        "(%s: %s)", name, type(e).__name__, e)
            return False
        return True

    async def _stop(self, runner: Any, name: str, invocation: str, after: float) -> None:
        """Stop the start ``invocation`` of ``name`` after ``after`` seconds, unless its
        engine step took the note meanwhile (and stops it itself) or it is over."""
        try:
            if after:
                await asyncio.sleep(after)
                if not self._untaken(name, invocation) or \
                        runner.state(name).state not in LIVE:
                    return
                log.warning("preset %s: its engine step did not act on the note that it "
                            "runs on the CPU: stopping it", name)
            await runner.stop(name)
            self.stopped.append(name)
        except Exception as e:   # a defect of ours, or the runner's: said, nothing more
            log.warning("preset %s: runs on the CPU and was not stopped: %s: %s", name,
                        type(e).__name__, e)

    def _untaken(self, name: str, invocation: str) -> bool:
        """Whether the note for ``invocation`` is still there and that start still the
        preset's current one (its runtime plan's)."""
        runtime_dir = self.host.runtime_dir
        if read_note(runtime_dir, name, invocation) is None:
            return False
        try:
            read_runtime_plan(runtime_dir, name, invocation)
        except StalePlanError:
            return False
        return True
