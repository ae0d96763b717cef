"""The systemd Manager calls that the socket alignments make (:mod:`lokid.runners.gatewaysocket`,
:mod:`lokid.runners.portsockets`), in one copy: a unit's properties, a job queued on a unit
in mode "replace", a unit listing. The names are the systemd runner's."""

from __future__ import annotations

from typing import Any

from dbus_fast.aio import MessageBus

from ..host.buscall import call, plain
from .systemd_runner import PROPERTIES, SYSTEMD, SYSTEMD_MANAGER, SYSTEMD_PATH

# An action of the alignments, as the Manager's method that queues it
JOBS = {"start": "StartUnit", "stop": "StopUnit", "restart": "RestartUnit"}


async def unit_properties(bus: MessageBus, unit: str, interface: str,
                          names: tuple[str, ...]) -> dict[str, Any]:
    """``names`` of ``unit``'s ``org.freedesktop.systemd1.<interface>`` (loaded if need be)."""
    (path,) = await call(bus, SYSTEMD, SYSTEMD_PATH, SYSTEMD_MANAGER, "LoadUnit", "s", [unit])
    out = {}
    for name in names:
        (value,) = await call(bus, SYSTEMD, str(path), PROPERTIES, "Get", "ss",
                              [SYSTEMD + "." + interface, name])
        out[name] = plain(value)
    return out


async def active_state(bus: MessageBus, unit: str) -> str:
    return str((await unit_properties(bus, unit, "Unit", ("ActiveState",)))["ActiveState"])


async def queue(bus: MessageBus, action: str, unit: str) -> None:
    """``action`` (a key of :data:`JOBS`) of ``unit``, mode "replace"; DBusError as systemd says."""
    await call(bus, SYSTEMD, SYSTEMD_PATH, SYSTEMD_MANAGER, JOBS[action], "ss", [unit, "replace"])


async def units_matching(bus: MessageBus, pattern: str) -> list[str]:
    """The names of the loaded units matching ``pattern``."""
    (units,) = await call(bus, SYSTEMD, SYSTEMD_PATH, SYSTEMD_MANAGER, "ListUnitsByPatterns",
                          "asas", [[], [pattern]])
    return [str(u[0]) for u in units]
