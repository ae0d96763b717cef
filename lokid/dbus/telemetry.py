"""The daemon's telemetry: engine lines counted, Stats published, the Prometheus textfile.

Every engine line the daemon reads (the journal under systemd, the engine's pipe
under the local runner) reaches :meth:`Telemetry.on_line` and is counted by
:class:`~lokid.watch.meter.Meters`; a failure there is one log line and never
stops the verdicts the same lines feed. Once a second, :meth:`Telemetry.publish`
emits ``PropertiesChanged(Stats)`` for the presets whose figures moved, warns of
a start whose requests could not be read, and rewrites the node_exporter
textfile (:mod:`lokid.watch.promfile`) when something changed, or every 15 s.

The same tick checks the engines stopped when idle (:mod:`lokid.dbus.idle`): they are
judged from the same meters, and the count of their stops is published here, with the
on-demand sight (:mod:`lokid.dbus.sight`: cold starts, swaps, the gateway's requests).

Memory per GPU comes from the engine's load lines where it runs at ``-lv 4``;
for a running start without them, every :data:`GPU_EVERY` seconds, from the
NVIDIA driver's per-process figures (:mod:`lokid.host.nvml`, optional), over the
processes the runner lists for the start. ``memory_source`` says which;
``memory_note`` why there are none when the driver cannot be asked. An engine
without any GPU backend is never asked about.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, Protocol

from ..core.errors import LokiError
from ..core.launch.runtimeplan import RuntimePlan
from ..core.serve.replicas import is_replica, preset_of, split_instance
from ..host.nvml import GpuMemory
from ..runners.runner import INACTIVE, READY, EngineState, Runner
from ..watch.meter import BLIND_AFTER, Meters
from ..watch.promfile import Textfile
from .footprints import Footprints
from .idle import IdleStops
from .interfaces import PresetInterface
from .oncpu import OnCpu
from .registry import Registry
from .room import AFTER_READY, DeviceRoom
from .sight import Sight


class TelemetryHost(Protocol):
    """What the telemetry reads of the daemon (the daemon is one): where the runtime and
    config files are, the presets as read and their exported objects, the runner and the
    engines' states, and whether the daemon is stopping."""

    config_dir: str
    runtime_dir: str
    registry: Registry
    exported: dict[str, PresetInterface]
    running: dict[str, RuntimePlan]   # each running start's runtime plan
    stopping: asyncio.Event

    @property
    def runner(self) -> Runner | None: ...

    def engine_state(self, name: str) -> EngineState: ...

    def active_presets(self) -> list[str]: ...

    async def stop(self, name: str) -> str: ...

log = logging.getLogger("lokid.daemon")  # the daemon's own lines, as before

STATS_EVERY = 1.0   # seconds between two PropertiesChanged(Stats) of one preset, at most
GPU_EVERY = 5.0     # seconds between two questions to the NVIDIA driver
NVML_SOURCE = "NVIDIA driver (NVML), per process"


class Telemetry:
    def __init__(self, daemon: TelemetryHost):
        self.daemon = daemon
        self.meters = Meters(daemon.runtime_dir)
        # the engines stopped when idle (lokid.dbus.idle), checked at each publisher tick
        self.idle = IdleStops(daemon, self.meters)
        # on-demand states and counters (lokid.dbus.sight); their changes mark the Stats
        self.sight = Sight(daemon, lambda name: self.meters.dirty.add(name))
        self.idle.on_stop = self.sight.idle_stop
        self.meters.on_in_flight = self._in_flight_moved
        self.meter_failed = False
        # the Prometheus textfile (lokid.toml metrics_textfile): None when off; its path as
        # last read (None: not read yet)
        self.textfile: Textfile | None = None
        self.metrics_path: str | None = None
        # starts being read again from the journal: preset → (invocation, until, the
        # lines that arrived meanwhile)
        self.replaying: dict[str, tuple[str, float, list[tuple[str, float | None]]]] = {}
        # the driver's figures: preset → (invocation, MiB per device or None, why not)
        self.gpu = GpuMemory()
        # each ready load's footprint, measured and kept (lokid.dbus.footprints)
        self.footprints = Footprints(self)
        # a start found running on the CPU: said, and stopped where its preset says so
        self.cpu = OnCpu(daemon)
        self.gpu_mib: dict[str, tuple[str, dict[str, float] | None, str]] = {}
        self.gpu_engines: dict[str, bool] = {}  # engine path → has a GPU backend (or unknown)
        # each device's room and each preset's need on it (lokid.dbus.room)
        self.room = DeviceRoom(self, self._devices_moved)

    def on_state(self, name: str, state: EngineState) -> None:
        """An engine's new state: the idle stop's clock, the on-demand state."""
        self.idle.on_state(name, state)
        self.sight.on_state(name, state)
        self.footprints.on_state(name, state)
        self.room.changed(AFTER_READY if state.state == READY else 0.0)

    def _devices_moved(self, rows: list[dict[str, Any]]) -> None:
        from .variants import json_variant

        manager = getattr(self.daemon, "manager", None)
        if manager is not None:
            manager.emit_properties_changed({"Devices": [json_variant(r) for r in rows]})

    def _in_flight_moved(self, name: str) -> None:
        name = preset_of(name)   # a replica's requests are its preset's (issue 47)
        self.idle.announce_in_flight(name)
        self.sight.request_seen(name)

    def stats_variant(self, name: str) -> Any:
        """:meth:`stats` as the ``Stats`` property's value."""
        from .variants import json_variant

        return json_variant(self.stats(name))

    def stats(self, name: str) -> dict[str, Any]:
        """The preset's telemetry for its current start (``{}`` before any), with the URL
        its engine answers at (a wildcard as loopback) and the UNIX socket it listens on
        where systemd holds that address (the gateway's way in: lokid.gateway.sockets).

        The address is the running start's (its runtime plan) while one runs, else the
        next start's plan. The plan alone was wrong twice: a preset whose start pulls
        its model has no plan until the model is there, so its engine was ready with no
        URL and a request waited for one until it gave up (issue 49, the README's first
        request); and a port edited while the engine runs pointed the gateway at the
        new port before any engine listened there.
        """
        from ..core.address import engine_url

        out = self.meters.snapshot(name)
        view = self.daemon.registry.presets.get(name)
        running = self.daemon.running.get(name)
        if running is not None:
            out["url"] = engine_url(running.host, running.port)
        elif view is not None and view.listen is not None:
            out["url"] = engine_url(*view.listen)
        socket = running.socket if running is not None else (
            view.plan.socket if view is not None and view.plan is not None else "")
        if socket:
            out["socket"] = socket
        if view is not None and view.auto_blocked:
            out["verdict"] = view.auto_blocked
        runner = self.daemon.runner
        restarts = runner.restarts(name) if runner is not None else None
        if restarts is not None:
            out["restarts"] = restarts
        out.update(self.idle.stats(name))
        out.update(self.sight.stats(name))
        out.update(self.footprints.stats(name))
        got = self.gpu_mib.get(name)
        if got is not None and not out.get("memory_mib") and got[0] == out.get("invocation"):
            if got[1]:
                out["memory_mib"], out["memory_source"] = got[1], NVML_SOURCE
            elif got[1] is None and got[2]:
                out["memory_note"] = got[2]
        return out

    async def sample_gpu(self) -> None:
        """Ask the NVIDIA driver about the running starts whose engine log says nothing
        of their memory; a change marks the preset's Stats for publishing."""
        runner = self.daemon.runner
        if runner is None:
            return
        for name in sorted(self.daemon.active_presets()):
            start = self.meters.starts.get(name)
            view = self.daemon.registry.presets.get(name)
            if start is None or start.log.load.buffers or view is None or view.plan is None \
                    or not await self.has_gpu(view.plan.argv[0]):
                self.gpu_mib.pop(name, None)
                continue
            pids = await runner.engine_pids(name)
            if not pids:
                continue
            reading = await asyncio.to_thread(self.gpu.used, pids)
            entry = (start.invocation, reading, self.gpu.why_unknown())
            if self.gpu_mib.get(name) != entry:
                self.gpu_mib[name] = entry
                self.meters.dirty.add(name)

    async def has_gpu(self, engine: str) -> bool:
        """Whether the engine at this path has a GPU backend, or may have (a static build:
        unknown); read once per path."""
        known = self.gpu_engines.get(engine)
        if known is None:
            from ..host.probe import engine_gpu_backends

            backends = await asyncio.to_thread(engine_gpu_backends, engine)
            known = self.gpu_engines[engine] = backends != ()
        return known

    def on_line(self, preset: str, invocation: str, line: str, at: float | None) -> None:
        """An engine line, counted; a failure of the counting never stops the verdicts."""
        self.footprints.on_line(preset, line)   # an allocation that failed, if it says so
        try:
            self.meters.feed(preset, invocation, line, at)
        except Exception as e:
            if not self.meter_failed:  # once: a parser defect would repeat on every line
                self.meter_failed = True
                log.warning("telemetry: a line of preset %s was not counted (%s: %s); "
                            "later failures are not logged", preset, type(e).__name__, e)

    async def publish(self) -> None:
        """PropertiesChanged(Stats) at most once a second per preset whose figures moved."""
        from .variants import json_variant

        ticks = 0
        while not self.daemon.stopping.is_set():
            await asyncio.sleep(STATS_EVERY)
            ticks += 1
            try:
                await self.idle.check()
            except Exception as e:  # a defect of ours: the Stats go on, the engines run
                log.warning("idle stop: %s: %s", type(e).__name__, e)
            self.sight.check()
            if ticks % round(GPU_EVERY / STATS_EVERY) == 1:
                try:
                    await self.sample_gpu()
                except Exception as e:  # never a reason to stop publishing
                    log.warning("GPU memory from the NVIDIA driver: %s: %s", type(e).__name__, e)
            while self.meters.blind:
                blind = self.meters.blind.pop(0)
                log.warning("preset %s: its engine finished %d requests and lokid read the figures "
                            "of none: the engine's log format may have changed, its Stats are "
                            "blind", blind, BLIND_AFTER)
            figures = {name: self.stats(name) for name in self.meters.take_dirty()
                       if name in self.daemon.exported or self.textfile is not None}
            for name, stats in figures.items():
                iface = self.daemon.exported.get(name)
                if iface is not None:
                    iface.emit_properties_changed({"Stats": json_variant(stats)})
            await self.write_metrics(figures)

    async def read_settings(self) -> None:
        """lokid.toml was read (the daemon's start, a reload): the metrics file's place, and
        the room again ([placement] host_memory and reserve may have changed)."""
        await self.read_metrics_setting()
        self.room.changed()

    async def read_metrics_setting(self) -> None:
        """lokid.toml's ``metrics_textfile`` (a broken lokid.toml: the default; its error is
        the presets' to report). A new path takes over from the old one, whose file goes."""
        from ..core.config import files as cfg
        from ..watch.promfile import where

        def read() -> tuple[str, str]:
            try:
                path = cfg.load_global(self.daemon.config_dir).metrics_textfile
            except LokiError:
                path = cfg.DEFAULT_METRICS_TEXTFILE
            return path, where(path)

        path, said = await asyncio.to_thread(read)
        if path == self.metrics_path:
            return
        self.metrics_path = path
        if self.textfile is not None:
            await asyncio.to_thread(self.textfile.close)
        self.textfile = Textfile(path) if path else None
        log.info("%s", said)

    async def write_metrics(self, figures: dict[str, dict[str, Any]]) -> None:
        """The Prometheus textfile (:mod:`lokid.watch.promfile`), when figures (``figures``:
        the presets' that moved) or states changed, else every REFRESH seconds. Nothing here
        may stop the Stats publisher: a failure is logged once."""
        import time

        from ..watch.promfile import Record, render

        tf = self.textfile
        if tf is None:
            return
        try:
            names = sorted(set(self.daemon.registry.presets) | set(self.daemon.active_presets()))
            names += self._replicas()   # each replica past the first, its own engine
            views = {n: self.daemon.registry.presets.get(preset_of(n)) for n in names}
            states = {n: self.daemon.engine_state(n).state for n in names}
            # an example (example = true) cannot start by design: no alert for it
            examples = self.daemon.registry.examples
            broken = sorted(n for n in self.daemon.registry.unstartable() if n not in examples)
            waits, peers = sorted(self.room.waits()), self.sight.peers()
            key = [(n, states[n], v.model if v else "", v.auto_blocked if v else "")
                   for n, v in views.items()], broken, waits, sorted(peers.items())
            if not tf.due(bool(figures), key, time.monotonic()):
                return
            records = []
            for n, v in views.items():
                stats = figures[n] if n in figures else self.meters.snapshot(n)
                k = (split_instance(n) or (n, 1))[1]
                records.append(Record(preset_of(n), v.model if v else "", states[n], stats,
                                      v.auto_blocked if v else "",
                                      tf.starts(n, stats.get("invocation")),
                                      self.idle.count(n) if k == 1 else None,
                                      self.sight.stats(n) if k == 1 else {},
                                      self.room.memory(n) if k == 1 else {}, replica=k))
            await asyncio.to_thread(tf.write, render(records, time.time(), broken,
                                                     dict(self.sight.swaps),
                                                     self.room.devices(), waits, peers))
        except Exception as e:  # a defect of ours (the writer logs its OSErrors itself):
            if not tf.render_failed:  # the Stats and the engines go on
                tf.render_failed = True
                log.warning("Prometheus metrics: not written (%s: %s); later failures are not "
                            "logged", type(e).__name__, e)

    def _replicas(self) -> list[str]:
        """The instances of replicas 2 and up whose engines run or failed (issue 47)."""
        runner = self.daemon.runner
        return sorted(n for n, st in (runner.states.items() if runner is not None else ())
                      if is_replica(n) and st.state != INACTIVE
                      and preset_of(n) in self.daemon.registry.presets)

    def on_line_live(self, preset: str, invocation: str, line: str, at: float | None) -> None:
        """:meth:`on_line`, held back while a replay of that start runs (see :meth:`replay`):
        a line the replay reads too (not after ``until``) is dropped, a later one waits."""
        held = self.replaying.get(preset)
        if held is not None and held[0] == invocation:
            if at is not None and at <= held[1]:
                return
            held[2].append((line, at))
            return
        self.on_line(preset, invocation, line, at)

    def hold(self, presets: list[str], until: float) -> None:
        """Before the journal watcher starts: the running starts of ``presets`` will be read
        again from the journal up to ``until`` (:meth:`replay`); their lines from the
        watcher wait until then."""
        from ..core.errors import StalePlanError
        from ..store.runtimedir import read_runtime_plan

        for name in presets:
            try:
                invocation = read_runtime_plan(self.daemon.runtime_dir, name).invocation
            except StalePlanError:
                continue
            if invocation:
                self.replaying[name] = (invocation, until, [])

    async def replay(self) -> None:
        """After a restart of the daemon, the figures of the starts still running (those
        :meth:`hold` registered), read again from the journal: their load, and the last
        minutes (what the windows need); totals then count from the gap, said as
        ``counted_from``. The lines that arrived meanwhile follow."""
        from systemd import journal

        from ..watch.journalwatch import invocation_drops, invocation_lines

        todo = {name: (invocation, until) for name, (invocation, until, _) in
                self.replaying.items()}

        def read() -> tuple[Meters, dict[str, float | None]]:
            meters, gaps = Meters(self.daemon.runtime_dir), {}
            for name, (invocation, until) in todo.items():
                reader = journal.Reader(flags=journal.SYSTEM_ONLY)
                drops = journal.Reader(flags=journal.SYSTEM_ONLY)
                try:
                    lines, gaps[name] = invocation_lines(reader, invocation, until)
                    lost = invocation_drops(drops, invocation, until)
                finally:
                    reader.close()
                    drops.close()
                # lines journald dropped stay said (issue 45, item 9), in their place
                events: list[tuple[float, int, str | int]] = [(at, 1, x) for x, at in lines]
                events += [(at, 0, n) for n, at in lost if at >= (gaps[name] or 0.0)]
                for at, kind, what in sorted(events, key=lambda e: e[:2]):
                    if kind:
                        meters.feed(name, invocation, str(what), at)
                    else:
                        meters.gap(name, invocation, int(what), at)
            return meters, gaps

        try:
            replayed, gaps = await asyncio.to_thread(read)
            for name in todo:
                if self.meters.adopt(name, replayed, gaps.get(name)):
                    log.info("preset %s: its running start's figures read again from the "
                             "journal%s", name, " (totals from the last minutes)"
                             if gaps.get(name) is not None else "")
        except Exception as e:  # the journal unreadable: the figures count from now
            log.warning("the running engines' figures were not read again from the journal "
                        "(%s: %s): they count from now", type(e).__name__, e)
        finally:
            for name, (invocation, _) in todo.items():
                _, _, waiting = self.replaying.pop(name)
                current = self.meters.starts.get(name)
                if current is not None and current.invocation != invocation:
                    continue  # a newer start began meanwhile: these lines are the old one's
                for line, at in waiting:
                    self.on_line(name, invocation, line, at)

    async def close(self) -> None:
        """At the daemon's stop: no stale figures for node_exporter to serve."""
        self.footprints.close()
        self.room.close()
        if self.textfile is not None:
            await asyncio.to_thread(self.textfile.close)
