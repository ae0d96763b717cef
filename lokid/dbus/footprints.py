"""Each ready load's footprint, measured and kept (issue 29, item 2).

:data:`SETTLE` seconds after an engine becomes ready (its compute buffers and CUDA
context are allocated by then: READY comes after the load's warm-up), the daemon reads
what the engine holds:

- per GPU, the NVIDIA driver's per-process figure over the start's processes (an engine
  with a GPU backend, the driver asked as :mod:`lokid.dbus.telemetry` does), else the
  engine's buffer lines where it printed them (``-lv 4``);
- on the host, what the engine holds: under systemd, its unit's cgroup's ``memory.stat``
  without the page cache of files it read and does not map (issue 44, item 11,
  :mod:`lokid.core.place.held`: ``MemoryCurrent`` made a fully offloaded 40 GB model
  "need" 40 GB of RAM), and ``MemoryCurrent`` only where that file cannot be read; the
  engine's resident memory under the local runner.

The record (:mod:`lokid.core.place.footprint`) is kept in the state DB under the
preset's memory key, so that the next start of the same configuration (after a restart
of lokid too) is placed by it, and shown in the preset's ``Stats`` (``footprint``:
bytes per device, each figure's source, and a sentence). A load whose key changed
meanwhile (the preset was edited while it ran) is not kept: it measured the old one.

A start that fails out of memory (issue 29, item 5) is read from the engine's own lines
(:mod:`lokid.core.place.oomline`: the allocation that failed, and on which device) and
raises the record (:func:`lokid.core.place.footprint.corrected`): to what the device can
hold at all, since what the device had free at the start's beginning (the daemon's last
reading of the room) or the failed allocation is only a lower bound (issue 45, item 13:
raised an eighth past it at each failure, a preset that never fits cost 4 failed starts
and 11 evictions of idle engines). The gateway then places the next start by that
figure, evicting what it must once; a second failure at the bound makes the preset one
that never fits, refused with the figures. The warning in the daemon's journal gives
them, and the failed start's job says how it ran out of memory (:meth:`out_of_memory`),
which the gateway answers its clients.

Issue 44: a GPU is named as the host names it, through the start's CUDA_VISIBLE_DEVICES
(:func:`lokid.core.place.footprint.engine_gpu`), for buffer lines as for failures. A
failure at compute time (``CUDA error: out of memory`` and its ``current device: N``)
says no size: like the kernel's oom-kill, it is raised to what the device had free at
the start, and at least to what the record held there (the engine held that, and asked
for more). A GPU pinned by UUID is known only by that name: where the record measured
as many GPUs as the start sees, a failure there raises each of them (which is which,
only the driver knows, and a UUID preset's need is per GPU); else the record keeps the
UUID's own entry, which is what a UUID preset's per-GPU need reads.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any, Protocol

from ..core.errors import StateError
from ..core.place.footprint import (
    CGROUP,
    ESTIMATE,
    PROCESS,
    SOURCE_WORDS,
    Footprint,
    corrected,
    measure,
)
from ..core.place.oomline import OomReader, visible_of
from ..core.place.policy import HOST, size_text
from ..core.record import replace
from ..host.nvml import GpuMemory
from ..runners.local_runner import LocalRunner
from ..runners.runner import FAILED, LOADING, READY, EngineState, restarting
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
LINES_LAG = 3.0   # seconds a failed start's last lines may come after its state (journal)
RESTART_SEEN_TRIES = 12   # quarter seconds for systemd's restart pause to show after FAILED


class Footprints:
    def __init__(self, telemetry: Telemetry):
        self.telemetry = telemetry
        self.tasks: dict[str, asyncio.Task[None]] = {}
        self.correcting: dict[str, asyncio.Task[None]] = {}
        self.states: dict[str, tuple[str, bool]] = {}   # (state, restarting) last seen
        # per preset, for its current start: the devices' free memory when it began,
        # the GPUs it sees (CUDA_VISIBLE_DEVICES), and the allocations that failed
        self.start_free: dict[str, dict[str, int]] = {}
        self.visible: dict[str, tuple[str, ...]] = {}
        self.failed: dict[str, dict[str, int]] = {}
        self.readers: dict[str, OomReader] = {}   # per preset: its start's OOM lines
        # per preset: what its current start's out-of-memory failure was, in words, for
        # its job's end (the clients' reply), kept after the record was raised
        self.said: dict[str, str] = {}

    def on_line(self, preset: str, line: str) -> None:
        """An engine line: an allocation that failed is kept for its start's end."""
        reader = self.readers.get(preset)
        if "failed" not in line and "out of memory" not in line and \
                (reader is None or not reader.reported):
            return
        if reader is None:
            reader = self.readers[preset] = OomReader()
        if preset not in self.visible:   # read once per start, at its first such line
            self.visible[preset] = self._visible(preset)
        found = reader.feed(line, self.visible[preset])
        if found is not None:
            device, nbytes = found
            failed = self.failed.setdefault(preset, {})
            failed[device] = max(failed.get(device, 0), nbytes)
            self.said[preset] = failure_words(failed, self.start_free.get(preset, {}))

    def out_of_memory(self, name: str) -> str:
        """How the preset's current start ran out of memory ("host: an allocation of
        488 MiB failed, 1.9 GiB was free when it began"), "" when it did not: what its
        failed job says to clients, instead of the engine's last line ("exiting due to
        model loading error") or the load's last progress line (issue 45, item 13)."""
        return self.said.get(name, "")

    def on_state(self, name: str, state: EngineState) -> None:
        """A preset's engine is ready: measure it once it settled; any other state gives
        up a measurement under way (the engine it was for is gone). A start begins: its
        room noted; a start failed after an allocation failed: its record raised."""
        # under systemd a failed start is LOADING again at once ("restarting after a
        # failure": Restart=on-failure's pause), FAILED only once lokid's rule stopped
        was = self.states.get(name, ("", False))
        now = (state.state, restarting(state))
        self.states[name] = now
        if now == was:
            return   # a new Status or detail in the same state
        failed = state.state == FAILED or now[1]
        if failed and "oom-kill" in state.detail:   # the kernel's, in its cgroup: no line
            self.failed.setdefault(name, {}).setdefault(HOST, 0)
            self.said[name] = failure_words(self.failed[name], self.start_free.get(name, {}))
        if state.state == LOADING and was[0] != LOADING and not failed:
            self._begins(name)
        task = self.tasks.pop(name, None)
        if task is not None and not task.done():
            task.cancel()
        if state.state == READY or failed:
            try:
                loop = asyncio.get_running_loop()
            except RuntimeError:   # no loop: a caller outside the daemon
                return
            if state.state == READY:
                self.failed.pop(name, None)
                self.tasks[name] = loop.create_task(self._measure_later(name))
            elif name not in self.correcting:   # not cancelled by the states that follow
                task = loop.create_task(self._correct_later(name))
                self.correcting[name] = task
                task.add_done_callback(lambda _t: self.correcting.pop(name, None))

    def _begins(self, name: str) -> None:
        self.failed.pop(name, None)
        self.said.pop(name, None)
        room = getattr(self.telemetry.room, "room", None)
        self.start_free[name] = dict(room.free) if room is not None else {}
        self.visible.pop(name, None)
        self.readers.pop(name, None)

    def _visible(self, name: str) -> tuple[str, ...]:
        """The GPUs the running start sees (its runtime plan's CUDA_VISIBLE_DEVICES)."""
        from ..core.errors import StalePlanError
        from ..store.runtimedir import read_runtime_plan

        try:
            rp = read_runtime_plan(self.telemetry.daemon.runtime_dir, name)
        except StalePlanError:
            return ()
        return visible_of(rp.env.get("CUDA_VISIBLE_DEVICES"))

    async def _correct_later(self, name: str) -> None:
        waited = 0.0
        while not self.failed.get(name) and waited < LINES_LAG:
            await asyncio.sleep(0.25)
            waited += 0.25
        try:
            out_of_memory = bool(self.failed.get(name))
            await self.correct(name)
            runner = self.telemetry.daemon.runner
            if not out_of_memory or runner is None:
                return
            # systemd shows the unit failed, then in its pause before the restart
            for _ in range(RESTART_SEEN_TRIES):
                if restarting(runner.state(name)):
                    break
                await asyncio.sleep(0.25)
            if restarting(runner.state(name)):
                # it would start again in RestartSec into the same room and fail the
                # same way: the placement decides when there is room for it instead
                log.warning("preset %s: its automatic restart is cancelled: it failed out "
                            "of memory and would fail the same way; the next start is "
                            "placed by its footprint record", name)
                self._begins(name)
                await runner.stop(name)
        except asyncio.CancelledError:
            raise
        except Exception as e:   # a defect of ours: the record stays as it was
            log.warning("preset %s: its footprint was not corrected: %s: %s", name,
                        type(e).__name__, e)

    async def correct(self, name: str) -> Footprint | None:
        """Raise the record of a start that failed out of memory (see the module's
        docstring); None when no allocation failed or nothing can be raised."""
        failed = self.failed.pop(name, None)
        daemon = self.telemetry.daemon
        view = daemon.registry.presets.get(name)
        if not failed or view is None or not view.memory_key:
            return None
        key = view.memory_key
        base = view.footprint if view.footprint is not None and view.footprint.key == key \
            else None
        room = self.telemetry.room
        if base is None:   # never measured: the estimate, where the start put it
            sizing = room.sizing(name, running=True)
            if sizing is None:
                return None
            fixed = dict(sizing.need.fixed)
            base = Footprint(key, fixed, {d: ESTIMATE for d in fixed}, fixed)
        free = self.start_free.get(name, {})
        failed = _by_name(failed, base)
        # a failure of unknown size (0: oom-kill, compute time): at least what was free,
        # and what the record held there
        lower = {d: max(n, free.get(d, 0), 0 if n else base.held.get(d, 0))
                 for d, n in failed.items()}
        devices = room.room.devices if room.room is not None else ()
        capacity = {d.name: d.capacity for d in devices}
        found = corrected(base, lower, capacity)
        if found == base:
            return None
        try:
            await asyncio.to_thread(_save, daemon.registry.state_dir, name, found)
        except StateError as e:
            log.warning("preset %s: its raised footprint could not be kept: %s", name, e)
        now = daemon.registry.presets.get(name)
        if now is not None and now.memory_key == key:
            daemon.registry.presets[name] = replace(now, footprint=found)
        self.telemetry.meters.dirty.add(name)
        self.telemetry.room.changed()
        words = []
        for d, n in failed.items():
            now_held = found.held.get(d, 0)
            words.append(f"{failure_words({d: n}, free)}; its need there is raised from "
                         f"{size_text(base.held.get(d, 0))} to {size_text(now_held)}"
                         + (" (all the device can hold)" if now_held == capacity.get(d)
                            else ""))
        never = any(found.held.get(d, 0) > capacity[d] for d in failed if d in capacity)
        log.warning("preset %s: its start failed out of memory (%s): %s", name,
                    "; ".join(words),
                    "it can never fit on this host as it is, so starts for requests are "
                    "refused with the figures; a start by hand that becomes ready measures "
                    "it again" if never else
                    "the gateway places its next start by that figure, waiting or evicting "
                    "for the room")
        return found

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
        # what it holds (its cgroup's memory.stat under systemd), else the sampler's figure
        held = getattr(runner, "held_memory", None)
        host = await held(name) if held is not None else None
        sampler = await runner.io_sampler(name) if host is None else None
        if sampler is not None:
            sample = await sampler()
            host = sample.memory_bytes if sample is not None else None
        load = self.telemetry.meters.snapshot(name).get("load_seconds")
        estimated = view.footprint.estimated if view.footprint is not None else {}
        found = measure(key, nvml=nvml, buffers=buffers, host_bytes=host,
                        visible=self._visible(name),
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
        for task in [*self.tasks.values(), *self.correcting.values()]:
            task.cancel()
        self.tasks.clear()
        self.correcting.clear()


def failure_words(failed: dict[str, int], free: dict[str, int]) -> str:
    """A start's out-of-memory failure, per device: what failed, and what was free when
    it began ("host: an allocation of 488 MiB failed, 1.9 GiB was free when it began")."""
    words = []
    for d, n in failed.items():
        text = f"{d}: an allocation of {size_text(n)} failed" if n else \
            f"{d}: the kernel killed it for memory (oom-kill)" if d == HOST else \
            f"{d}: out of memory while it ran (no size said)"
        if d in free:
            text += f", {size_text(free[d])} was free when it began"
        words.append(text)
    return "; ".join(words)


def _by_name(failed: dict[str, int], base: Footprint) -> dict[str, int]:
    """``failed`` with each GPU named by UUID (``GPU-…``, ``MIG-…``) put on the GPUs the
    record measured, where it measured as many as were named so (see the module
    docstring); else kept under the UUID."""
    uuids = [d for d in failed if d.startswith(("GPU-", "MIG-"))]
    measured = [d for d, s in base.sources.items() if d != HOST and s != ESTIMATE
                and not d.startswith(("GPU-", "MIG-"))]
    if not uuids or len(measured) != len(uuids):
        return failed
    out = {d: n for d, n in failed.items() if d not in uuids}
    most = max(failed[d] for d in uuids)
    for d in measured:
        out[d] = max(out.get(d, 0), most)
    return out


def _save(state_dir: str, name: str, found: Footprint) -> None:
    with StateDB(state_dir) as db:
        db.save_footprint(name, found)
