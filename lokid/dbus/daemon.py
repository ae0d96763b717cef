"""``lokid daemon``: the presets on the bus as ``org.lokid.Lokid1``, their engines, the journal.

asyncio and dbus-fast, on the system bus (``--bus session`` for development
and tests). Readiness means ready: READY=1 goes to systemd only once the
presets are loaded, the engines' state is known and the bus name is owned.
WATCHDOG=1 means serving on the bus: each ping follows a round trip through
the bus that says the name is still this daemon's (:mod:`lokid.dbus.serving`),
so a blocked loop or a lost bus stops the pings; a connection that ends, or a
name that is no longer ours, ends the daemon with exit status 1, for systemd to
start it again. ``Reload()`` and SIGHUP read the presets again (a broken file is reported
and skipped, the others stay served) and, under systemd, rerun the generator
(``daemon-reload``) so the units' drop-ins follow; SIGTERM/SIGINT stop the daemon.

Engines are run by a runner (:mod:`lokid.runners.runner`): through systemd's D-Bus API when
systemd is the system manager and the daemon is on the system bus (:mod:`lokid.runners.
systemd_runner`), else as the daemon's own children (:mod:`lokid.runners.local_runner`).
Their changes become the ``EngineStateChanged`` signal (sent first), the preset objects'
``State``/``Status``/``SpecActive``, ``ActivePresets``.

Layers-in-RAM verdicts come from the engines' output: the journal watcher
(:mod:`lokid.watch.journalwatch`) under systemd, the local runner's pipes
otherwise. A verdict is recorded in the state DB, the preset is planned again
and ``VerdictRecorded`` is emitted.

Verbs are authorised per call (:mod:`lokid.dbus.authz`) before they run. The same engine
lines are counted for each preset's ``Stats`` and Prometheus (:mod:`lokid.dbus.telemetry`).
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import sys
from typing import Any

from dbus_fast import BusType
from dbus_fast.constants import NameFlag, RequestNameReply

from ..core import access
from ..core.bench.iosample import IOSampler
from ..core.config.files import PRESETS_DIR
from ..core.config.secrets import mask_argv
from ..core.errors import DaemonError, LokiError, StalePlanError
from ..core.launch.runtimeplan import RuntimePlan
from ..core.names import ACTION_EDIT, BUS_NAME, preset_object_path
from ..core.telemetry.lasterror import LastErrors
from ..core.wording import counted
from ..host.notify import Notifier
from ..planning.gather import user_of
from ..runners.background import Background
from ..runners.runner import LIVE, LOADING, READY, STOPPING, EngineState, Runner
from ..store.dirwatch import DirWatch
from ..store.runtimedir import read_runtime_plan
from ..store.state import StateDB
from .authz import MANAGE_GROUP, Authority, current_call
from .benching import Benches
from .editing import Editor
from .groupstops import GroupStops
from .interfaces import ManagerInterface, PresetInterface
from .jobs import JobReports
from .logs import Logs
from .readyplans import ReadyPlans
from .registry import Registry
from .replicas import Replicas
from .reveal import Revealer
from .serving import Serving, close_parts, serve_until_lost
from .team import close_team, export_all
from .telemetry import Telemetry
from .unload import Unloads
from .wire import SafeMessageBus

log = logging.getLogger("lokid.daemon")  # as the journal has always said it

# How long loading the presets waits for the engine's --help (all presets together):
# an engine that hangs there must not hold the daemon's readiness. Its presets are
# served meanwhile with "has not answered --help yet", and planned again at its end.
PROBE_BUDGET = 1.0
REPLAN_AFTER_READY = 0.5   # s: a ready engine's first request is answered meanwhile


class Daemon:
    def __init__(self, config_dir: str, state_dir: str, runtime_dir: str, bus_type: BusType,
                 bus_address: str | None = None, runner: str = "auto",
                 manage_group: str = MANAGE_GROUP):
        self.config_dir = config_dir
        self.registry = Registry(config_dir, state_dir, runtime_dir)
        self.registry.loading = lambda name: self.engine_state(name).state in (LOADING, STOPPING)
        self.registry.answered = lambda name: self.engine_state(name).state == READY
        self.registry.probe_budget = PROBE_BUDGET
        if runner == "auto":
            from ..runners.systemd_runner import systemd_reachable

            runner = "systemd" if systemd_reachable(bus_type == BusType.SYSTEM) else "local"
        # under systemd, presets are planned as the unit will run them (its user)
        self.registry.for_units = runner == "systemd"
        self.followed_probe: Any = None
        self.runtime_dir = runtime_dir
        self.bus_type = bus_type
        self.bus_address = bus_address
        self.runner_kind = runner   # "systemd" or "local" ("auto" decided above)
        self.manage_group = manage_group
        self.bus: SafeMessageBus | None = None
        self.authority: Authority | None = None
        self.runner: Runner | None = None
        self.manager = ManagerInterface(self)
        self.exported: dict[str, PresetInterface] = {}
        self.spec_in_use: dict[str, list[str]] = {}
        # preset → its running start's runtime plan: PendingRestart, RunningArgv, its URL
        self.running: dict[str, RuntimePlan] = {}
        self.signalled: dict[str, str] = {}   # preset → the state EngineStateChanged last said
        self.last_errors = LastErrors()       # the engine's last error line, per preset
        self.notifier = Notifier()
        self.stopping = asyncio.Event()
        self.watcher: Any = None
        self.dirwatch: Any = None
        self.reloading: asyncio.Task[Any] | None = None
        self.background = Background(log)
        self.telemetry = Telemetry(self)
        self.editor = Editor(self)
        self.unloads = Unloads(self)   # UnloadPreset: a stop after the requests in flight
        self.logs = Logs(lambda: self.runner)
        self.benches = Benches(config_dir, state_dir, runtime_dir,
                               state_of=lambda name: self.engine_state(name).state,
                               known=self.registry.get, sampler=self._io_sampler,
                               progress=self.manager.BenchProgress, saved=self._refresh)
        self.reload_again = False
        self.sockets: Any = None   # the gateway's and the ports' (runners.sockets), at need
        self.ready_plans = ReadyPlans(config_dir, state_dir, runtime_dir,
                                      for_unit=self.registry.for_units,
                                      spawn=self.background.spawn)
        self.jobs = JobReports(self, self.background.spawn, self.manager.JobFinished)
        self.group_stops = GroupStops(self)   # a group's start overlaps its stops
        self.replicas = Replicas(self)   # a preset's engines past the first (issue 47)

    # -- what the D-Bus interfaces read (interfaces.Backend) --------------------------

    def engine_state(self, name: str) -> EngineState:
        return self.runner.state(name) if self.runner is not None else EngineState()

    def spec_active(self, name: str) -> list[str]:
        return list(self.spec_in_use.get(name, []))

    def pending_restart(self, name: str) -> bool:
        """Whether the running start's command line (argv and environment) differs from
        the one the preset's next start would run: an edit waits for a restart."""
        running = self.running.get(name)
        view = self.registry.presets.get(name)
        if running is None or view is None or view.plan is None:
            return False
        plan, now = view.plan, (tuple(running.argv), dict(running.env))
        return (tuple(plan.argv), dict(plan.env)) != now

    def running_argv(self, name: str) -> list[str]:
        """The command line of the running start (its runtime plan), [] when none runs."""
        running = self.running.get(name)
        return list(running.argv) if running is not None else []

    def active_presets(self) -> list[str]:
        if self.runner is None:
            return []
        return sorted(n for n, s in self.runner.states.items() if s.state in LIVE and ":" not in n)

    def runner_in_use(self) -> str:
        return self.runner.kind if self.runner is not None else ""

    def status(self) -> str:
        broken = len(self.registry.unstartable())
        active = len(self.active_presets())
        if self.registry.problem:
            return f"serving no presets: {self.registry.problem}"
        return (f"serving {counted(len(self.registry.presets), 'preset')}"
                + (f", {active} running" if active else "")
                + (f", {broken} broken" if broken else ""))

    # -- verbs ----------------------------------------------------------------------

    async def authorize(self, member: str, action: str) -> None:
        assert self.authority is not None
        await self.authority.check(member, action)

    async def reveals(self) -> bool:
        """Whether the caller of the current method may see secret values (the edit right)."""
        assert self.authority is not None
        msg = current_call()
        return msg is not None and await self.authority.allows(msg, ACTION_EDIT)

    async def caller(self) -> access.User | None:
        """Who calls the current method, for what it may list (None: root, or this
        daemon's user, who see everything)."""
        assert self.authority is not None
        found = await self.authority.caller(current_call())
        return None if found is None else user_of(*found)

    def _preset_at(self, path: str) -> PresetInterface | None:
        return next((iface for name, iface in self.exported.items()
                     if preset_object_path(name) == path), None)

    async def _startable(self, name: str) -> None:
        """Refuse a preset that cannot be planned, with its reason (never hand it to systemd).

        The snapshot may be older than a fix (the model copied in since): a preset
        without a plan is planned again before it is refused.
        """
        if self.registry.get(name).plan is None:
            await self._refresh(name)
            view = self.registry.get(name)
            if view.plan is None and not view.pulls_first:   # a start pulls its model first
                raise view.failure()

    async def start(self, name: str) -> str:
        return await self._begin(name, "start")

    async def restart(self, name: str) -> str:
        return await self._begin(name, "restart")

    async def _begin(self, name: str, verb: str) -> str:
        await self._startable(name)
        assert self.runner is not None
        await self.group_stops.before_start(name)   # its GPU group's stops under way
        log.info("%sing preset %s", verb, name)
        return await self.replicas.begin(name, verb)   # its engine, then its replicas

    async def stop(self, name: str) -> str:
        assert self.runner is not None
        view = self.registry.presets.get(name)
        if view is not None and view.external is not None:
            raise view.failure()   # an external API: nothing runs here to stop
        if self.runner.state(name).state not in LIVE:
            self.registry.get(name)  # NotFound for a name that is neither known nor running
        log.info("stopping preset %s", name)
        self.group_stops.stop_asked(name)
        return await self.replicas.stop(name)   # its engine and its replicas

    async def clear_failures(self, name: str) -> int:
        self.registry.get(name)

        def clear() -> int:
            with StateDB(self.registry.state_dir) as db:
                return db.clear_failures(name)

        count = await asyncio.to_thread(clear)
        log.info("preset %s: %d recorded automatic-speculation failures forgotten", name, count)
        await self._refresh(name)
        return count

    async def bench(self, name: str, mode: str, predict: int, prompt: int,
                    repeat: int = 1) -> dict[str, Any]:
        """Benchmark the preset's ready engine (:mod:`lokid.dbus.benching`)."""
        return await self.benches.run(name, mode, predict, prompt, repeat)

    async def _io_sampler(self, name: str) -> IOSampler | None:
        return await self.runner.io_sampler(name) if self.runner is not None else None

    async def reload(self) -> None:
        """Read the presets again; under systemd, rerun the generator too."""
        if self.dirwatch is not None:
            # What is on disk now is read next: noted at once, on the loop, so that the
            # watcher does not announce a change just made (an edit's own write) while the
            # reading waits for a worker thread past the watcher's settle time.
            self.dirwatch.reading()
        await self.load_presets()
        await self.telemetry.read_settings()
        if self.runner is not None:
            await self.runner.reload()
            await self.runner.track(self.replicas.tracked(sorted(self.registry.presets)))

    # -- presets and engines --------------------------------------------------------

    def _read_files(self) -> None:
        """The presets read (in a worker thread); the file watcher told, not to read twice."""
        if self.dirwatch is not None:
            self.dirwatch.reading()
        self.registry.load()

    def _sync_objects(self) -> None:
        """Export one object per preset now known, unexport the ones gone."""
        assert self.bus is not None
        for name in set(self.exported) - set(self.registry.presets):
            self.bus.unexport(preset_object_path(name), self.exported.pop(name))
        for name in set(self.registry.presets) - set(self.exported):
            iface = PresetInterface(self, name)
            self.bus.export(preset_object_path(name), iface)
            self.exported[name] = iface

    async def load_presets(self) -> None:
        await asyncio.to_thread(self._read_files)
        self._follow_probe()
        for name, error in sorted(self.registry.broken.items()):
            log.warning("preset %s skipped: %s", name, error)
        self._sync_objects()
        self.manager.emit_properties_changed(
            {"Presets": self.manager.Presets, "BrokenPresets": self.manager.BrokenPresets})
        for iface in self.exported.values():
            view = self.registry.presets[iface.preset]
            iface.emit_properties_changed({"Model": view.model, "SpecMode": view.spec_mode,
                                           "Notes": view.notes, "Argv": mask_argv(view.argv),
                                           "AutoSpecBlocked": view.auto_blocked,
                                           "PendingRestart": self.pending_restart(iface.preset),
                                           **iface.serve_properties()})
        self.notifier.send(f"STATUS={self.status()}")
        log.info("presets loaded: %s", self.status())
        self._keep_plans_ready()

    def _keep_plans_ready(self) -> None:
        """The presets that start for requests, planned ahead (:mod:`lokid.dbus.readyplans`)."""
        self.ready_plans.after_load(sorted(
            name for name, view in self.registry.presets.items()
            if view.plan is not None and (view.serve.on_demand or view.serve.group)
            and self.engine_state(name).state not in LIVE))

    async def _reload_logged(self) -> None:
        try:
            await self.reload()
        except LokiError as e:
            log.warning("reload: %s", e)

    def _files_changed(self) -> None:
        """A preset or lokid.toml changed on disk: read them again, as ``Reload()`` does
        (one reload at a time; a change during one makes one more)."""
        if self.reloading is not None and not self.reloading.done():
            self.reload_again = True
            return

        async def again() -> None:
            while True:
                self.reload_again = False
                log.info("configuration files changed: reading the presets again")
                await self._reload_logged()
                if not self.reload_again:
                    return

        self.reloading = self.background.spawn(again(), "reading the changed files")

    def _systemd_reloaded(self) -> None:
        """``systemctl daemon-reload``: the presets as the units see them (no reload back)."""
        self.background.spawn(self._presets_logged(), "reading the presets after a systemd reload")

    async def _presets_logged(self) -> None:
        try:
            await self.load_presets()
            if self.runner is not None:
                await self.runner.track(self.replicas.tracked(sorted(self.registry.presets)))
        except LokiError as e:
            log.warning("reading the presets after a systemd reload: %s", e)
        await self._align_sockets()

    async def _align_sockets(self) -> None:
        """Under systemd, the gateway's socket and the on-demand ports as the files say: a
        reload loads the generator's units but starts none (:mod:`lokid.runners.sockets`)."""
        if self.runner_kind != "systemd" or self.bus is None:
            return
        if self.sockets is None:
            from ..runners.sockets import SocketsInLine

            self.sockets = SocketsInLine(self.bus, self.config_dir)
        await self.sockets.align()

    def _follow_probe(self) -> None:
        """A load gave up waiting for the engine's probe: plan again when it ends."""
        future = self.registry.pending_probe
        if future is None or future is self.followed_probe or self.bus is None:
            return
        self.followed_probe = future
        loop = asyncio.get_running_loop()

        def ended(_: object) -> None:  # in the probe's thread
            try:
                loop.call_soon_threadsafe(self._probe_ended)
            except RuntimeError:  # the loop is closed: the daemon has stopped
                pass

        log.info("the engine has not answered --help within %.0f s: serving the presets "
                 "unplanned until it does", PROBE_BUDGET)
        future.add_done_callback(ended)

    def _probe_ended(self) -> None:
        log.info("the engine's probe ended: planning the presets again")
        self.background.spawn(self.load_presets(), "planning the presets after the probe")

    def _on_engine(self, name: str, state: EngineState) -> None:
        """A runner saw an engine change: the signal, properties, the summary."""
        before_state = self.signalled.get(name)
        moved = before_state != state.state  # Status alone may have changed
        self.group_stops.seen(name, state.state)
        if moved:  # the signal (states; Status alone is PropertiesChanged's) first: a
            self.signalled[name] = state.state   # request waiting for it goes on at once
            self.manager.EngineStateChanged(name, state.state, state.detail or state.status)
        changed: dict[str, Any] = {"State": state.state, "Status": state.status}
        if moved and (state.state == READY or (state.state == LOADING and
                                                before_state not in LIVE)):
            self.last_errors.forget(name)  # a start by hand, or one that answers
        if moved:  # the runtime plan is read once per state, not per STATUS= line
            before = self.spec_in_use.get(name, [])
            pending = self.pending_restart(name)
            rp = self._running_plan(name) if state.state in LIVE else None
            self.spec_in_use[name] = list(rp.spec_types) if rp is not None else []
            running_before = self.running.pop(name, None)
            if rp is not None:
                self.running[name] = rp
            if rp != running_before:   # another start: its command line, where it answers
                changed["RunningArgv"] = mask_argv(self.running_argv(name))  # to everyone
                changed["Stats"] = self.telemetry.stats_variant(name)
            if self.spec_in_use[name] != before:
                changed["SpecActive"] = self.spec_in_use[name]
            if self.pending_restart(name) != pending:
                changed["PendingRestart"] = not pending
        if (iface := self.exported.get(name)) is not None:
            iface.emit_properties_changed(changed)
        self.telemetry.on_state(name, state)   # the idle stop's clock, the on-demand state
        if moved and before_state in (LOADING, STOPPING) \
                and state.state not in (LOADING, STOPPING) and name in self.registry.presets:
            # a start ended: its token is settled, the next plan may differ (after READY: soon)
            self.background.spawn(self._refresh(name, REPLAN_AFTER_READY if state.state == READY
                                                else 0.0), f"planning preset {name} again")
        if moved:
            log.info("preset %s: %s%s", name, state.state,
                     f" ({state.detail})" if state.detail else "")
            self.manager.emit_properties_changed({"ActivePresets": self.active_presets()})
            self.notifier.send(f"STATUS={self.status()}")

    def _engine_line(self, preset: str, invocation: str, line: str, at: float | None) -> None:
        """Every engine line (the local runner's pipe): its last error kept, then counted."""
        self.last_errors.feed(preset, invocation, line)
        self.telemetry.on_line(preset, invocation, line, at)

    def _engine_line_live(self, preset: str, invocation: str, line: str,
                          at: float | None) -> None:
        """Every engine line (the journal, under systemd): its last error kept, counted."""
        self.last_errors.feed(preset, invocation, line)
        self.telemetry.on_line_live(preset, invocation, line, at)

    def _running_plan(self, name: str) -> RuntimePlan | None:
        """The running start's runtime plan (None when there is none to read)."""
        try:
            return read_runtime_plan(self.runtime_dir, name)
        except StalePlanError:
            return None

    def _on_verdict(self, verdict: Any) -> None:
        log.warning("preset %s: automatic speculative decoding cut: %s",
                    verdict.preset, verdict.reason)
        self.manager.VerdictRecorded(verdict.preset, verdict.reason)
        self.background.spawn(self._refresh(verdict.preset),
                              f"planning preset {verdict.preset} again")

    async def _refresh(self, name: str, delay: float = 0.0) -> None:
        await asyncio.sleep(delay)
        try:
            view = await asyncio.to_thread(self.registry.refresh, name)
        except LokiError as e:
            log.warning("preset %s: %s", name, e)
            return
        self._follow_probe()
        iface = self.exported.get(name)
        if iface is not None:
            iface.emit_properties_changed({"AutoSpecBlocked": view.auto_blocked,
                                           "Notes": view.notes, "Argv": mask_argv(view.argv),
                                           "LastBench": iface.LastBench,
                                           "PendingRestart": self.pending_restart(name)})

    def _make_runner(self) -> Runner:
        assert self.bus is not None
        listener = self.replicas.apart(self._on_engine)   # a replica's change: its preset's
        if self.runner_kind == "systemd":
            from ..runners.systemd_runner import SystemdRunner

            return SystemdRunner(self.bus, listener, self.jobs.on_job,
                                 on_reloaded=self._systemd_reloaded)
        from ..runners.local_runner import LocalRunner
        from ..watch.journalwatch import LoadJudge

        judge = LoadJudge(self.registry.state_dir, self.runtime_dir, on_verdict=self._on_verdict,
                          log=lambda message, **_: log.warning("%s", message),
                          on_line=self._engine_line, on_cpu=self.telemetry.cpu)
        return LocalRunner(listener, self.config_dir, self.registry.state_dir,
                           self.runtime_dir, judge=judge, on_job=self.jobs.on_job)

    def _start_watcher(self, loop: asyncio.AbstractEventLoop) -> None:
        try:
            from ..watch.journalwatch import JournalWatcher

            self.watcher = JournalWatcher.system(
                self.registry.state_dir, self.runtime_dir, on_verdict=self._on_verdict,
                on_line=self._engine_line_live, on_cpu=self.telemetry.cpu,
                on_gap=self.telemetry.meters.gap)   # lines journald dropped (issue 45, 9)
            # running engines' earlier lines are read again from the journal (before attach)
            self.telemetry.hold(self.active_presets(), self.watcher.since or 0.0)
            self.watcher.attach(loop)
        except (OSError, ImportError) as e:
            log.warning("not following the engines' journal (%s): no layers-in-RAM verdicts", e)
            self.watcher = None

    def stats(self, name: str) -> dict[str, Any]:
        return self.telemetry.stats(name)

    async def _watchdog(self) -> None:
        """WATCHDOG=1 while the bus says the name is ours (:mod:`lokid.dbus.serving`)."""
        interval = self.notifier.watchdog_interval
        if not interval or self.bus is None:
            return
        await Serving(self.bus, BUS_NAME, interval / 3,
                      ping=lambda: self.notifier.send("WATCHDOG=1"),
                      lose=self.bus.lose).run()

    async def _close_parts(self, loop: asyncio.AbstractEventLoop) -> None:
        assert self.runner is not None
        await self.background.close()  # before the bus they may still use is closed
        await self.unloads.close()
        await close_team(self)   # the pulls' children, where they are the daemon's
        await self.telemetry.close()
        if self.watcher is not None:
            self.watcher.detach(loop)
        await self.runner.close()

    async def run(self) -> int:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, self.stopping.set)
        loop.add_signal_handler(signal.SIGHUP, lambda: self.background.spawn(
            self._reload_logged(), "reloading on SIGHUP"))
        await asyncio.to_thread(self.registry.load)
        await self.telemetry.read_settings()
        try:
            self.bus = await SafeMessageBus(bus_address=self.bus_address,
                                        bus_type=self.bus_type).connect()
        except (OSError, ValueError) as e:
            raise DaemonError(f"cannot connect to the {self.bus_type.name.lower()} bus: {e}") \
                from None
        self.authority = Authority(self.bus, self.manage_group)
        self.authority.install()
        authority = self.authority
        Revealer(self.bus, lambda msg: authority.allows(msg, ACTION_EDIT), self._preset_at,
                 self.background.spawn).install()
        self.runner = self._make_runner()
        try:
            await self.runner.attach()
            await self.runner.track(self.replicas.tracked(sorted(self.registry.presets)))
        except Exception as e:
            self.bus.disconnect()
            raise DaemonError(f"cannot follow the engines ({self.runner.kind} runner): "
                              f"{e}") from None
        export_all(self, self.bus)   # the manager, the team's interfaces (keys, usage, pulls)
        self._sync_objects()
        self._follow_probe()
        reply = await self.bus.request_name(BUS_NAME, NameFlag.DO_NOT_QUEUE)
        if reply not in (RequestNameReply.PRIMARY_OWNER, RequestNameReply.ALREADY_OWNER):
            await self.runner.close()
            self.bus.disconnect()
            raise DaemonError(f"cannot own {BUS_NAME} on the bus ({reply.name}): another "
                              "lokid daemon runs, or the bus policy denies it")
        if self.runner.kind == "systemd":
            self._start_watcher(loop)
            if self.watcher is not None:
                self.background.spawn(self.telemetry.replay(),
                                      "reading the running engines' figures again")
            self.background.spawn(self._align_sockets(), "aligning the sockets")
        self.dirwatch = DirWatch([self.config_dir, os.path.join(self.config_dir, PRESETS_DIR)],
                                 self._files_changed)
        how = self.dirwatch.attach(loop)
        self._keep_plans_ready()
        self.notifier.send("READY=1", f"STATUS={self.status()}")
        log.info("%s on the %s bus, %s runner, following the presets by %s: %s", BUS_NAME,
                 self.bus_type.name.lower(), self.runner.kind, how, self.status())
        watchdog = loop.create_task(self._watchdog())
        publisher = loop.create_task(self.telemetry.publish())
        why_lost: str | None = None
        try:
            why_lost = await serve_until_lost(self.bus, self.stopping)
            if why_lost is not None:
                log.error("lost the bus, and with it %s: %s; exiting with status 1 for "
                          "systemd to start the daemon again", BUS_NAME, why_lost)
        finally:
            self.notifier.send("STOPPING=1")
            self.editor.close()   # an edit still in its worker thread ends before it writes
            watchdog.cancel()
            publisher.cancel()
            self.dirwatch.detach()
            await close_parts(self._close_parts(loop), bounded=why_lost is not None)
            self.bus.disconnect()
            for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
                loop.remove_signal_handler(sig)
        return 0 if why_lost is None else 1


def main(config_dir: str, state_dir: str, runtime_dir: str, bus: str,
         bus_address: str | None = None, runner: str = "auto") -> int:
    logging.basicConfig(stream=sys.stderr, level=logging.INFO,
                        format="%(levelname)s %(name)s: %(message)s")
    # What the format never shows is not gathered: under the local runner every engine
    # line is a record, hundreds a second while it serves (the logging HOWTO's
    # "Optimization": no caller lookup, no thread or process fields).
    logging._srcfile = None
    logging.logThreads = False
    logging.logProcesses = False
    logging.logMultiprocessing = False
    bus_type = BusType.SESSION if bus == "session" else BusType.SYSTEM
    daemon = Daemon(config_dir, state_dir, runtime_dir, bus_type, bus_address, runner)
    return asyncio.run(daemon.run())
