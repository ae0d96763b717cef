"""The daemon's sight of memory (issue 29, items 1, 2 and 6): each device's room, and
what each preset needs on it.

- **Devices** (the manager's ``Devices``, ``lokictl top``, Prometheus): per device its
  total, what lokid's engines hold (the running presets' footprints: measured where
  they were, estimated before), what other processes hold, the operator's reserve and
  what is free, with where each figure comes from (:func:`lokid.host.devices.read_room`).
- **Memory** (a preset's ``Memory``): its need per device (:mod:`lokid.core.place.need`)
  on this room, each figure's source, one sentence, and why it can never fit here
  (``does_not_fit``: the refusal the gateway answers at once, and ``lokid plan`` too).
  A preset split with RPC workers (``rpc``) has none until its first load is measured:
  the estimate would count every layer here, where the engine puts some on the workers.
  Its devices whose room could not be read are in ``room_unknown`` with why (issue 44,
  item 10): no refusal for them, and the gateway does not wait for them. What each of
  its replicas past the first holds (``replicas_held``, issue 47): the gateway's
  placement counted the preset's own engine only, and saw the room replica 2 took as
  free, granting another preset a start there that could not load.

When it is read: at the daemon's start, when an engine changes state (:data:`AFTER_READY`
seconds after one became ready: the request that started it is being answered, on the
same cores on a small host), and when a reader
finds the last reading older than :data:`FRESH` seconds (then at once from the last
reading, and again once the new one is in, by ``PropertiesChanged``), after a footprint
was measured and at each reload: a daemon nobody asks reads nothing. Each reading
announces the presets whose ``Memory`` moved, so the gateway follows them by signals.
The engine's ``--list-devices`` (a process, and a GPU initialisation) is asked at most
every :data:`LIST_EVERY` seconds per engine; NVML and ``/proc/meminfo`` are cheap and
asked at each reading, in a worker thread (a busy driver can block).
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Callable, Mapping
from typing import Any, Protocol

from ..core.errors import LokiError, StalePlanError, printable
from ..core.fleet.rpc import workers_of
from ..core.launch.gpuselect import listing_env
from ..core.place.need import Sizing, size_plan
from ..core.place.policy import room_unknown
from ..core.serve.replicas import instance, preset_of
from ..host.devices import Room, listed_gpus, read_room, room_json
from ..planning.sizing import Memory, never_fits_here
from ..store.runtimedir import read_runtime_plan

log = logging.getLogger("lokid.daemon")

FRESH = 2.0          # seconds a reading serves readers before another is made
AFTER_READY = 0.1    # seconds after an engine answers: its first request has the cores
LIST_EVERY = 60.0    # seconds between two --list-devices of one engine
WAITS_FRESH = 30.0   # seconds a ReportWaits of the gateway holds (it repeats every 10 s)


class Host(Protocol):
    """What the room reads of :class:`lokid.dbus.telemetry.Telemetry`."""

    daemon: Any
    gpu: Any
    gpu_engines: dict[str, bool]   # engine path → has a GPU backend (as far as asked)

    async def has_gpu(self, engine: str) -> bool: ...


class DeviceRoom:
    def __init__(self, host: Host, announce: Callable[[list[dict[str, Any]]], None]):
        self.host = host
        self.announce = announce
        self.room: Room | None = None
        self.rows: list[dict[str, Any]] = []
        self.read_at = float("-inf")
        self.task: asyncio.Task[None] | None = None
        self.again = False   # a change came during a reading: one more
        self.later: asyncio.TimerHandle | None = None
        self.notes: tuple[str, ...] = ()
        self.listed: dict[str, tuple[float, tuple[dict[str, tuple[int, int, str]], str]]] = {}
        self.shown: dict[str, dict[str, Any]] = {}   # the Memory each preset last announced
        self.waiting: dict[str, str] = {}   # the gateway's ReportWaits: preset → why
        self.waiting_at = float("-inf")

    # --- readers -----------------------------------------------------------------------

    def devices(self) -> list[dict[str, Any]]:
        """The last reading's rows (a new reading is asked when it is old)."""
        self.look()
        return self.rows

    def memory(self, name: str) -> dict[str, Any]:
        """The preset's need on the last room read ({} without a plan)."""
        self.look()
        return self._memory(name)

    def _memory(self, name: str) -> dict[str, Any]:
        sizing = self.sizing(name)
        if sizing is None:
            return {}
        view = self.host.daemon.registry.presets.get(name)
        argv = view.plan.argv if view is not None and view.plan is not None else ()
        if workers_of(argv) and not sizing.measured:
            # split with RPC workers: the estimate counts every layer here, where the
            # engine puts some on the workers; unknown until its first load is measured,
            # so the gateway's placement neither holds its start back nor evicts for it
            return {}
        room = self.room
        # a device whose room is unknown refuses nothing and holds nothing back (the
        # gateway places by what is known: room_unknown in Memory)
        never = never_fits_here(argv, sizing, room.devices, room.unknown) \
            if room is not None else ""
        unknown = room_unknown(sizing.need, room.devices, room.unknown) \
            if room is not None else {}
        out = Memory(sizing, never, unknown).to_json()   # as lokid plan --json shows it
        daemon = self.host.daemon
        if sizing.need.count and name in daemon.active_presets():
            running = self.sizing(name, running=True)   # where its start put it
            if running is not None and not running.need.count:
                out["held"] = dict(running.need.fixed)
        held = {}
        for k in daemon.replicas.live(name) if name in daemon.active_presets() else ():
            running = self.sizing(instance(name, k), running=True)
            if running is not None and not running.need.count:
                held[str(k)] = dict(running.need.fixed)
        if held:
            out["replicas_held"] = held
        return out

    async def refusal(self, name: str) -> str:
        """Why a start of ``name`` for a request must be refused at once: this host can
        never hold it ("" when it can, when [placement] is off, or when nothing is known:
        a room that could not be read refuses nothing)."""
        if not self.host.daemon.registry.placement.enabled:
            return ""
        if self.room is None:
            try:
                await self.read()
            except Exception as e:   # a defect of ours: no refusal on a guess
                log.warning("the devices' memory could not be read: %s: %s",
                            type(e).__name__, e)
                return ""
        why = str(self.memory(name).get("does_not_fit", ""))
        return f"preset {name!r} {why}" if why else ""

    def sizing(self, name: str, gpu_engine: bool | None = None,
               running: bool = False) -> Sizing | None:
        """The preset's need on the last room read; None without a plan or a header.
        ``running``: of its engine as it runs (the GPUs its start chose, for ``gpus =
        "auto"``), not of its next start. ``name`` may be a replica's instance
        (``NAME:k``, lokid.core.serve.replicas): its preset's need, on the GPUs its own start
        chose."""
        view = self.host.daemon.registry.presets.get(preset_of(name))
        if view is None or view.plan is None or view.info is None:
            return None
        room = self.room
        if gpu_engine is None:
            gpu_engine = bool(self.host.gpu_engines.get(view.plan.argv[0], False))
        env = view.plan.env
        if running and view.plan.gpu_choice is not None:
            env = self._chosen(name, env)
        try:
            return size_plan(name, view.plan.argv, env, view.info,
                             host_gpus=room.gpus() if room is not None else (),
                             gpu_free=room.free if room is not None else None,
                             gpu_engine=gpu_engine, extra=view.extra,
                             footprint=view.footprint,
                             cost=view.footprint.load_seconds if view.footprint else None,
                             gpu_choice=view.plan.gpu_choice,
                             gpu_capacity={d.name: d.capacity for d in room.devices}
                             if room is not None else None,
                             gpu_uuids=room.uuids if room is not None else None)
        except (ValueError, LokiError):   # a KV type the estimate does not know
            return None

    def report_waits(self, waits: Mapping[str, str]) -> bool:
        """The gateway's word on why requests wait for room (preset → why), replacing
        the last; presets this daemon does not know are left out, each why made
        printable. Whether what :meth:`waits` shows changed."""
        before = self.waits()
        known = self.host.daemon.registry.presets
        self.waiting = {name: printable(why) for name, why in waits.items() if name in known}
        self.waiting_at = time.monotonic()
        return self.waits() != before

    def waits(self) -> dict[str, str]:
        """Why requests wait for room now, per preset; {} once the gateway has not said
        so for WAITS_FRESH seconds (it says it again while they wait: a gateway gone
        leaves nothing stale behind)."""
        if time.monotonic() - self.waiting_at > WAITS_FRESH:
            return {}
        return dict(self.waiting)

    def _chosen(self, name: str, env: Mapping[str, str]) -> Mapping[str, str]:
        """The plan's environment with the GPUs its running start chose (its runtime
        plan's CUDA_VISIBLE_DEVICES), or as it is when none is on record."""
        try:
            rp = read_runtime_plan(self.host.daemon.runtime_dir, name)
        except StalePlanError:
            return env
        visible = rp.env.get("CUDA_VISIBLE_DEVICES")
        return {**env, "CUDA_VISIBLE_DEVICES": visible} if visible else env

    # --- reading -----------------------------------------------------------------------

    def look(self) -> None:
        """Start a reading when the last one is older than FRESH (none under way)."""
        if time.monotonic() - self.read_at < FRESH:
            return
        self.changed()

    def changed(self, delay: float = 0.0) -> None:
        """Something the room depends on changed (an engine's state): read it again (once
        more after a reading under way, which may have read before the change); after
        ``delay`` seconds when told (a reading due sooner makes it)."""
        if self.later is not None:
            self.later.cancel()
            self.later = None
        if delay > 0:
            try:
                self.later = asyncio.get_running_loop().call_later(delay, self.changed)
            except RuntimeError:
                pass
            return
        if self.task is not None and not self.task.done():
            self.again = True
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:   # no loop: a caller outside the daemon
            return
        self.read_at = time.monotonic()
        self.task = loop.create_task(self._read())

    async def _read(self) -> None:
        while True:
            self.again = False
            try:
                await self.read()
            except Exception as e:   # a defect of ours: the last reading stays
                log.warning("the devices' memory could not be read: %s: %s",
                            type(e).__name__, e)
            if not self.again:
                return
            self.read_at = time.monotonic()

    async def read(self) -> Room:
        daemon = self.host.daemon
        registry = daemon.registry
        engines = sorted({v.plan.argv[0] for v in registry.presets.values()
                          if v.plan is not None})
        gpu_engines = [e for e in engines if await self.host.has_gpu(e)]
        held: dict[str, int] = {}
        # every engine of lokid's: each preset's own and its replicas' (issue 47)
        engines = [inst for name in daemon.active_presets()
                   for inst in (name, *(instance(name, k) for k in daemon.replicas.live(name)))]
        for name in engines:
            sizing = self.sizing(name, running=True)
            if sizing is not None:
                for device, nbytes in sizing.need.fixed.items():
                    held[device] = held.get(device, 0) + nbytes
        room = await asyncio.to_thread(
            read_room, registry.placement, engine=gpu_engines[0] if gpu_engines else None,
            gpu_engine=bool(gpu_engines), gpu=self.host.gpu, held=held, lister=self._listed)
        self.room = room
        rows = [{**row, "lokid": held.get(str(row["device"]), 0)} for row in room_json(room)]
        if room.notes and rows:
            rows[-1]["notes"] = list(room.notes)
        elif room.notes and room.notes != self.notes:   # no device to carry them: logged
            log.warning("devices: %s", "; ".join(room.notes))
        self.notes = room.notes
        if rows != self.rows:
            self.rows = rows
            self.announce(rows)
        self._announce_memory()
        return room

    def _announce_memory(self) -> None:
        """PropertiesChanged(Memory) for each preset whose need moved (a footprint measured,
        an edit, the room's GPUs): the gateway places by it without asking."""
        from .variants import json_variant

        exported = getattr(self.host.daemon, "exported", {})
        for name in list(self.host.daemon.registry.presets):
            memory = self._memory(name)
            if self.shown.get(name) == memory:
                continue
            self.shown[name] = memory
            iface = exported.get(name)
            if iface is not None:
                iface.emit_properties_changed({"Memory": json_variant(memory)})
        for gone in set(self.shown) - set(self.host.daemon.registry.presets):
            del self.shown[gone]

    def _listed(self, engine: str) -> tuple[dict[str, tuple[int, int, str]], str]:
        """listed_gpus, asked at most every LIST_EVERY seconds per engine (a thread's)."""
        now = time.monotonic()
        last = self.listed.get(engine)
        if last is not None and now - last[0] < LIST_EVERY:
            return last[1]
        # in the order lokid gives its engines (PCI bus: NVML's numbering, gpuselect)
        found = listed_gpus(engine, listing_env(os.environ))
        self.listed[engine] = (now, found)
        return found

    def close(self) -> None:
        if self.later is not None:
            self.later.cancel()
        if self.task is not None:
            self.task.cancel()
