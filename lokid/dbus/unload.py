"""``UnloadPreset``: stop a preset's engine once its requests in flight have finished
(issue 22, item 6; ``lokictl unload``).

A stop cuts the requests the engine is serving; an unload lets them end first. Its
steps, each for a failure it prevents:

- the requests waited for are the engine's own (``RequestsInFlight``, from its log
  lines, :mod:`lokid.dbus.idle`): those through the gateway and those straight to its
  port alike, never open connections; read first :data:`SETTLE` seconds after the
  unload was announced, and a 0 only once it held :data:`QUIET` seconds (the log is
  read through the journal, a moment behind the engine);
- the wait is bounded by the preset's ``serve.drain`` (default 2 min, as for a swap): a
  client streaming for ever does not hold the GPU for ever; past it the stop goes on,
  and the job's detail says how many were still in flight;
- then the ordinary stop (the daemon's ``StopPreset``: the unit's stop, its timeout
  and kill);
- the verb returns at once with a job id, and ``JobFinished(preset, job, "unload",
  result, state, detail)`` says how it ended once the engine is stopped; the detail says
  what it waited for ("waited 2.1 s for 1 request in flight to finish"). A second
  unload of the same preset meanwhile gets the same job;
- while the job runs the preset's ``Unloading`` property is true (PropertiesChanged at
  its start and its end): the gateway sends no new request to the engine meanwhile (a
  peer's replica answers, or the request waits for the unload's end and then starts the
  engine again, as any request for a stopped on-demand preset does). Without it a
  steady client kept the drain from ever reaching 0, and its next request, started
  during the stop, cancelled the stop: the unload of a preset in use never ended;
- an external preset is refused at once with what it is, as ``StopPreset`` refuses it:
  nothing runs here. (It used to get a job that failed at its stop, and lokictl then
  advised its logs and a start, neither of which an external API has.)
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from typing import Any, Protocol

from ..core.errors import LokiError
from ..core.serve.tables import span_text
from ..core.wording import counted
from ..runners.runner import LIVE, READY, EngineState
from .registry import Registry

log = logging.getLogger("lokid.daemon")

POLL = 0.05           # seconds between two looks at the requests in flight and the state
# Seconds from the Unloading announcement to the first look at the requests in flight,
# and a 0 must still be 0 QUIET seconds later: a request the gateway sent just before it
# heard of the unload shows in the engine's log (read through the journal) a moment
# later. Without them a rolling upgrade under a streaming client cut 1 stream in 1,204.
SETTLE = 1.0
QUIET = 0.3
STOP_WAIT = 600.0     # seconds the stop has to end before the job says so (the unit's own
                      # stop timeout kills the engine well before)


class UnloadHost(Protocol):
    """What an unload needs of the daemon (the daemon is one)."""

    registry: Registry
    manager: Any     # its JobFinished signal
    exported: dict[str, Any]   # preset → its PresetInterface (PropertiesChanged)
    telemetry: Any   # telemetry.idle.in_flight: RequestsInFlight

    def engine_state(self, name: str) -> EngineState: ...

    async def stop(self, name: str) -> str: ...


class Unloads:
    def __init__(self, host: UnloadHost):
        self.host = host
        self.jobs: dict[str, str] = {}    # preset → its unload's job under way
        self.tasks: set[asyncio.Task[None]] = set()
        self.ids = itertools.count(1)

    async def unload(self, name: str) -> str:
        """UnloadPreset: the job's id; the stop itself comes once the requests ended."""
        if name in self.jobs:
            return self.jobs[name]
        view = self.host.registry.presets.get(name)
        if view is not None and view.external is not None:
            raise view.failure()   # an external API: nothing runs here to unload, as to stop
        state = self.host.engine_state(name).state
        if state not in LIVE:
            self.host.registry.get(name)   # NotFound for a name neither known nor running
        job = f"unload-{next(self.ids)}"
        self.jobs[name] = job
        self._say(name)
        task = asyncio.get_running_loop().create_task(self._run(name, job))
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)
        return job

    def unloading(self, name: str) -> bool:
        """The Unloading property: an unload of ``name`` is under way."""
        return name in self.jobs

    def _say(self, name: str) -> None:
        iface = self.host.exported.get(name)
        if iface is not None:
            iface.emit_properties_changed({"Unloading": self.unloading(name)})

    def in_flight(self, name: str) -> int:
        return int(self.host.telemetry.idle.in_flight(name))

    async def _run(self, name: str, job: str) -> None:
        try:
            result, detail = await self._drain_and_stop(name)
        except Exception as e:   # a defect of ours: the job still ends, the daemon goes on
            log.exception("preset %s: unload failed", name)
            result, detail = "failed", f"internal error in lokid: {type(e).__name__}"
        finally:
            self.jobs.pop(name, None)
            self._say(name)
        state = self.host.engine_state(name).state
        log.info("preset %s: unloaded (%s)", name, detail)
        self.host.manager.JobFinished(name, job, "unload", result, state, detail)

    async def _drain_and_stop(self, name: str) -> tuple[str, str]:
        view = self.host.registry.presets.get(name)
        drain = view.serve.drain if view is not None else 120.0
        began = time.monotonic()
        first = most = self.in_flight(name)
        if self.host.engine_state(name).state == READY:
            await asyncio.sleep(min(SETTLE, drain))
        while self.host.engine_state(name).state == READY:
            now = self.in_flight(name)
            most = max(most, now)
            if time.monotonic() - began >= drain:
                break
            if now == 0:
                await asyncio.sleep(QUIET)
                if self.in_flight(name) == 0:
                    break
                continue
            await asyncio.sleep(POLL)
        waited = time.monotonic() - began
        left = self.in_flight(name) if self.host.engine_state(name).state == READY else 0
        if not most:
            said = "no request in flight"
        elif left:
            said = (f"its drain ({span_text(drain)}) passed with {counted(left, 'request')} "
                    f"of {most} still in flight")
        else:
            said = f"waited {waited:.1f} s for {counted(most, 'request')} in flight to finish"
        if first == 0 and most:
            said += " (begun after the unload was asked)"
        try:
            await self.host.stop(name)
        except LokiError as e:
            return "failed", f"{said}; the stop failed: {e}"
        deadline = time.monotonic() + STOP_WAIT
        while self.host.engine_state(name).state in LIVE:
            if time.monotonic() >= deadline:
                return "timeout", (f"{said}; stopped, but the engine is still "
                                   f"{self.host.engine_state(name).state}")
            await asyncio.sleep(POLL)
        return "done", f"{said}, then stopped"

    async def close(self) -> None:
        for task in list(self.tasks):
            task.cancel()
        for task in list(self.tasks):
            try:
                await task
            except BaseException:
                pass
