"""The sockets a reload loads but does not start, brought in line after each one: the
gateway's (:mod:`lokid.runners.gatewaysocket`) and each on-demand preset's port
(:mod:`lokid.runners.portsockets`). Only under systemd; what each socket was last
aligned to is kept here, between reloads, because systemd shows the reloaded settings
and not what a running socket bound."""

from __future__ import annotations

import asyncio
import logging

from dbus_fast.aio import MessageBus

from ..core.errors import LokiError

log = logging.getLogger("lokid.systemd")


class SocketsInLine:
    def __init__(self, bus: MessageBus, config_dir: str):
        self.bus = bus
        self.config_dir = config_dir
        self.gateway: tuple[str, ...] | None = None   # the listen the socket was aligned to
        self.ports: dict[str, str] | None = None      # preset → its port socket's address
        # one alignment at a time: a reload of lokid's own (a changed file) and the
        # operator's daemon-reload come together, and each reads what the other changes
        self.lock = asyncio.Lock()

    async def align(self) -> None:
        async with self.lock:
            await self._align()

    async def _align(self) -> None:
        from ..core.config.files import load_global
        from .gatewaysocket import align as align_gateway
        from .portsockets import align as align_ports
        from .portsockets import wanted_ports

        try:
            glob = await asyncio.to_thread(load_global, self.config_dir)
        except LokiError:
            pass   # the generator and the presets' load say what is wrong with it
        else:
            action = await align_gateway(self.bus, glob.gateway.listen, self.gateway)
            if action != "warn":   # a warned change is still to apply: warned again next time
                self.gateway = glob.gateway.listen
        wanted = await asyncio.to_thread(wanted_ports, self.config_dir)
        self.ports = await align_ports(self.bus, wanted, self.ports)
