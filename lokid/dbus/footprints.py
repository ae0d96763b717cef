"""Each ready load's footprint, measured and kept (issue 29, item 2).

:data:`SETTLE` seconds after an engine becomes ready (its compute buffers and CUDA
context are allocated by then: READY comes after the load's warm-up), the daemon reads
what the engine holds:

- per GPU, the NVIDIA driver's per-process figure over the start's processes (an engine
  with a GPU backend, the driver asked as :mod:`lokid.dbus.telemetry` does), else the
  engine's buffer lines where it printed them (``-lv 4``);
- on the host, the runner's memory figure of the engine: the unit's ``MemoryCurrent``
  under systemd (its cgroup, page cache of the model included), the engine's resident
  memory under the local runner.

The record (:mod:`lokid.core.place.footprint`) is kept in the state DB under the
preset's memory key, so that the next start of the same configuration (after a restart
of lokid too) is placed by it, and shown in the preset's ``Stats`` (``footprint``:
bytes per device, each figure's source, and a sentence). A load whose key changed
meanwhile (the preset was edited while it ran) is not kept: it measured the old one.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import replace
from typing import Any, Protocol

from ..core.errors import StateError
from ..core.place.footprint import CGROUP, PROCESS, SOURCE_WORDS, Footprint, measure
from ..host.nvml import GpuMemory
from ..runners.local_runner import LocalRunner
from ..runners.runner import READY, EngineState
from ..store.state import StateDB


class Telemetry(Protocol):
    """What the measurement reads of :class:`lokid.dbus.telemetry.Telemetry`: the daemon
    (its registry and runner), the engines' meters, the NVIDIA driver and which engines
    have a GPU backend."""

    daemon: Any
    meters: Any
    gpu: GpuMemory
    room: Any   # lokid.dbus.room.DeviceRoom

    async def has_gpu(self, engine: str) -> bool: ...

log = logging.getLogger("lokid.daemon")

SETTLE = 2.0   # seconds after READY before the figures are read


class Footprints:
    def __init__(self, telemetry: Telemetry):
        self.telemetry = telemetry
        self.tasks: dict[str, asyncio.Task[None]] = {}

    def on_state(self, name: str, state: EngineState) -> None:
        """A preset's engine is ready: measure it once it settled; any other state gives
        up a measurement under way (the engine it was for is gone)."""
        task = self.tasks.pop(name, None)
        if task is not None and not task.done():
            task.cancel()
        if state.state == READY:
            try:
                loop = asyncio.get_running_loop()
            except RuntimeError:   # no loop: a caller outside the daemon
                return
            self.tasks[name] = loop.create_task(self._measure_later(name))

    async def _measure_later(self, name: str) -> None:
        await asyncio.sleep(SETTLE)
        try:
            await self.measure(name)
        except asyncio.CancelledError:
            raise
        except Exception as e:   # a defect of ours: the engine serves on, unmeasured
            log.warning("preset %s: its footprint was not measured: %s: %s", name,
                        type(e).__name__, e)

    async def measure(self, name: str) -> Footprint | None:
        """Read, keep and publish the footprint of the preset's running engine."""
        daemon = self.telemetry.daemon
        view = daemon.registry.presets.get(name)
        runner = daemon.runner
        if view is None or view.plan is None or not view.memory_key or runner is None:
            return None
        key = view.memory_key
        start = self.telemetry.meters.starts.get(name)
        buffers = dict(start.log.load.buffers) if start is not None else {}
        nvml = None
        if await self.telemetry.has_gpu(view.plan.argv[0]):
            pids = await runner.engine_pids(name)
            if pids:
                nvml = await asyncio.to_thread(self.telemetry.gpu.used, pids)
        host = None
        sampler = await runner.io_sampler(name)
        if sampler is not None:
            sample = await sampler()
            host = sample.memory_bytes if sample is not None else None
        load = self.telemetry.meters.snapshot(name).get("load_seconds")
        estimated = view.footprint.estimated if view.footprint is not None else {}
        found = measure(key, nvml=nvml, buffers=buffers, host_bytes=host,
                        host_source=PROCESS if isinstance(runner, LocalRunner) else CGROUP,
                        estimated=estimated,
                        load_seconds=load if isinstance(load, (int, float)) else None,
                        at=time.time())
        now = daemon.registry.presets.get(name)
        if found is None or now is None or now.memory_key != key:
            return None   # nothing read, or the preset changed since: not this one's
        try:
            await asyncio.to_thread(_save, daemon.registry.state_dir, name, found)
        except StateError as e:
            log.warning("preset %s: its footprint could not be kept: %s", name, e)
        daemon.registry.presets[name] = replace(now, footprint=found)
        self.telemetry.meters.dirty.add(name)
        self.telemetry.room.changed()   # its need is measured now: Memory and Devices move
        log.info("preset %s: its engine holds %s", name, found.describe())
        return found

    def stats(self, name: str) -> dict[str, Any]:
        """``footprint`` for the preset's Stats: what the last load of its configuration
        held, per device, and from where ({} before any)."""
        view = self.telemetry.daemon.registry.presets.get(name)
        f = view.footprint if view is not None else None
        if f is None:
            return {}
        return {"footprint": {"bytes": dict(f.held), "sources": {
            d: SOURCE_WORDS.get(s, s) for d, s in f.sources.items()}, "text": f.describe(),
            "measured_at": f.at}}

    def close(self) -> None:
        for task in self.tasks.values():
            task.cancel()
        self.tasks.clear()


def _save(state_dir: str, name: str, found: Footprint) -> None:
    with StateDB(state_dir) as db:
        db.save_footprint(name, found)
