"""A start whose GPU engine runs on the CPU, as the daemon acts on it (issue 44, item 3).

The journal watcher (or the local runner's judge) finds it at the start's "ready at"
(:meth:`lokid.core.enginelog.Load.on_cpu`: a GPU backend that did not start, or
"offloaded" with every buffer in host memory) and writes lokid's own journal entry;
the Stats carry it as ``on_cpu`` (:mod:`lokid.core.telemetry`). Here the daemon says it
in its own log, and a preset with ``cpu_fallback = "fail"`` is stopped: an operator who
would rather have no engine than one 10-100x slower gets no engine, and a line saying
why. The stop goes through the runner as the operator's own would (the restart cancelled
with it: the next start would find the same GPU missing); the engine's unit is not
marked failed, because a stop is not the engine's failure. A defect here is one log
line: never a reason to stop an engine the preset lets run.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, Protocol

log = logging.getLogger("lokid.daemon")


class Host(Protocol):
    """What this reads of the daemon: the presets as read (each view's ``cpu_fallback``)
    and the runner that stops an engine."""

    registry: Any

    @property
    def runner(self) -> Any: ...


class OnCpu:
    """Called with each start found running on the CPU (an ``AutoCut``'s shape: preset,
    invocation, reason)."""

    def __init__(self, host: Host):
        self.host = host
        self.stops: set[asyncio.Task[None]] = set()
        self.stopped: list[str] = []   # the presets stopped so, in order (for the tests)

    def __call__(self, found: Any) -> None:
        name, why = found.preset, found.reason
        view = self.host.registry.presets.get(name)
        fail = view is not None and getattr(view, "cpu_fallback", "run") == "fail"
        log.warning("preset %s: its engine runs on the CPU: %s%s", name, why,
                    "; stopped, as its cpu_fallback = \"fail\" says" if fail else
                    " (cpu_fallback = \"fail\" in the preset stops such a start)")
        runner = self.host.runner
        if not fail or runner is None:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:   # no loop: a caller outside the daemon
            return
        task = loop.create_task(self._stop(runner, name))
        self.stops.add(task)
        task.add_done_callback(self.stops.discard)

    async def _stop(self, runner: Any, name: str) -> None:
        try:
            await runner.stop(name)
            self.stopped.append(name)
        except Exception as e:   # a defect of ours, or the runner's: said, nothing more
            log.warning("preset %s: runs on the CPU and was not stopped: %s: %s", name,
                        type(e).__name__, e)
