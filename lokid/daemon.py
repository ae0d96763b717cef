"""``lokid daemon``: the presets on the bus as ``org.lokid.Lokid1``, and the journal watcher.

asyncio and dbus-fast, on the system bus (``--bus session`` for development
and tests). Readiness means ready: READY=1 goes to systemd only once the
presets are loaded and the bus name is owned. WATCHDOG=1 is sent from the
event loop itself, so a blocked loop stops the pings. SIGHUP reloads the
presets (a broken file is reported and skipped, the others stay served);
SIGTERM/SIGINT stop the daemon.

The journal watcher (:mod:`lokid.journalwatch`) runs in the same loop when
the journal is readable: its verdicts are recorded in the state DB, the
preset is planned again and ``VerdictRecorded`` is emitted.

This is the read-only part of the daemon; the verbs (start, stop, restart,
reload over the bus) come with the engine runners and the authorisation
model.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import sys
from typing import Any

from dbus_fast import BusType
from dbus_fast.aio import MessageBus
from dbus_fast.constants import NameFlag, RequestNameReply

from .dbusapi import ManagerInterface, PresetInterface
from .errors import LokiError
from .names import BUS_NAME, OBJECT_PATH, preset_object_path
from .registry import Registry
from .supervisor import Notifier

log = logging.getLogger("lokid.daemon")


class DaemonError(LokiError):
    """The daemon cannot start (bus unreachable, name taken)."""


class Daemon:
    def __init__(self, config_dir: str, state_dir: str, runtime_dir: str, bus_type: BusType,
                 bus_address: str | None = None):
        self.registry = Registry(config_dir, state_dir)
        self.runtime_dir = runtime_dir
        self.bus_type = bus_type
        self.bus_address = bus_address
        self.bus: MessageBus | None = None
        self.manager = ManagerInterface(self.registry)
        self.exported: dict[str, PresetInterface] = {}
        self.notifier = Notifier()
        self.stopping = asyncio.Event()
        self.watcher: Any = None

    def status(self) -> str:
        broken = len(self.registry.broken)
        return (f"serving {len(self.registry.presets)} presets"
                + (f", {broken} broken" if broken else ""))

    def _sync_objects(self) -> None:
        """Export one object per preset now known, unexport the ones gone."""
        assert self.bus is not None
        for name in set(self.exported) - set(self.registry.presets):
            self.bus.unexport(preset_object_path(name), self.exported.pop(name))
        for name in set(self.registry.presets) - set(self.exported):
            iface = PresetInterface(self.registry, name)
            self.bus.export(preset_object_path(name), iface)
            self.exported[name] = iface

    async def reload(self) -> None:
        await asyncio.to_thread(self.registry.load)
        for name, error in sorted(self.registry.broken.items()):
            log.warning("preset %s skipped: %s", name, error)
        self._sync_objects()
        self.manager.emit_properties_changed(
            {"Presets": self.manager.Presets, "BrokenPresets": self.manager.BrokenPresets})
        for iface in self.exported.values():
            view = self.registry.presets[iface.preset]
            iface.emit_properties_changed({"Model": view.model, "SpecMode": view.spec_mode,
                                           "Notes": view.notes, "Argv": view.argv,
                                           "AutoSpecBlocked": view.auto_blocked})
        self.notifier.send(f"STATUS={self.status()}")
        log.info("presets loaded: %s", self.status())

    def _on_verdict(self, verdict: Any) -> None:
        log.warning("preset %s: automatic speculative decoding cut: %s",
                    verdict.preset, verdict.reason)
        self.manager.VerdictRecorded(verdict.preset, verdict.reason)
        asyncio.get_running_loop().create_task(self._refresh(verdict.preset))

    async def _refresh(self, name: str) -> None:
        try:
            view = await asyncio.to_thread(self.registry.refresh, name)
        except LokiError as e:
            log.warning("preset %s: %s", name, e)
            return
        iface = self.exported.get(name)
        if iface is not None:
            iface.emit_properties_changed({"AutoSpecBlocked": view.auto_blocked,
                                           "Notes": view.notes, "Argv": view.argv})

    def _start_watcher(self, loop: asyncio.AbstractEventLoop) -> None:
        try:
            from .journalwatch import JournalWatcher

            self.watcher = JournalWatcher.system(self.registry.state_dir, self.runtime_dir,
                                                 on_verdict=self._on_verdict)
            self.watcher.attach(loop)
        except (OSError, ImportError) as e:
            log.warning("not following the engines' journal (%s): no layers-in-RAM verdicts", e)
            self.watcher = None

    async def _watchdog(self) -> None:
        interval = self.notifier.watchdog_interval
        if not interval:
            return
        while not self.stopping.is_set():
            self.notifier.send("WATCHDOG=1")
            await asyncio.sleep(interval / 3)

    async def run(self) -> int:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, self.stopping.set)
        loop.add_signal_handler(signal.SIGHUP, lambda: loop.create_task(self.reload()))
        await asyncio.to_thread(self.registry.load)
        try:
            self.bus = await MessageBus(bus_address=self.bus_address,
                                        bus_type=self.bus_type).connect()
        except (OSError, ValueError) as e:
            raise DaemonError(f"cannot connect to the {self.bus_type.name.lower()} bus: {e}") \
                from None
        self.bus.export(OBJECT_PATH, self.manager)
        self._sync_objects()
        reply = await self.bus.request_name(BUS_NAME, NameFlag.DO_NOT_QUEUE)
        if reply not in (RequestNameReply.PRIMARY_OWNER, RequestNameReply.ALREADY_OWNER):
            self.bus.disconnect()
            raise DaemonError(f"cannot own {BUS_NAME} on the bus ({reply.name}): another "
                              "lokid daemon runs, or the bus policy denies it")
        self._start_watcher(loop)
        self.notifier.send("READY=1", f"STATUS={self.status()}")
        log.info("%s on the %s bus: %s", BUS_NAME, self.bus_type.name.lower(), self.status())
        watchdog = loop.create_task(self._watchdog())
        try:
            await self.stopping.wait()
        finally:
            self.notifier.send("STOPPING=1")
            watchdog.cancel()
            if self.watcher is not None:
                self.watcher.detach(loop)
            self.bus.disconnect()
            for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
                loop.remove_signal_handler(sig)
        return 0


def main(config_dir: str, state_dir: str, runtime_dir: str, bus: str,
         bus_address: str | None = None) -> int:
    logging.basicConfig(stream=sys.stderr, level=logging.INFO,
                        format="%(levelname)s %(name)s: %(message)s")
    bus_type = BusType.SESSION if bus == "session" else BusType.SYSTEM
    daemon = Daemon(config_dir, state_dir, runtime_dir, bus_type, bus_address)
    return asyncio.run(daemon.run())
