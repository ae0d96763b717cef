"""The objects lokid exports at ``/org/lokid/Lokid1``: the manager, and the team's
interfaces beside it (issue 46): ``org.lokid.Lokid1.Keys`` (the gateway's named client
keys, :mod:`lokid.dbus.keys`) and ``org.lokid.Lokid1.Usage`` (who used what,
:mod:`lokid.dbus.usage`).

Interfaces of their own, not more methods on the manager: each has its own polkit
action and its own bus policy lines, and a client that knows only the manager (an older
lokictl, the Cockpit page of an older release) sees nothing change.
"""

from collections.abc import Callable
from typing import Any

from dbus_fast.service import ServiceInterface

from ..core.names import OBJECT_PATH

# Each makes one interface for the daemon (its Backend); added by the modules above.
FACTORIES: list[Callable[[Any], ServiceInterface]] = []


def export_all(backend: Any, bus: Any) -> dict[str, ServiceInterface]:
    """Export the manager and every team interface at OBJECT_PATH; by interface name."""
    bus.export(OBJECT_PATH, backend.manager)
    exported = {}
    for factory in FACTORIES:
        iface = factory(backend)
        bus.export(OBJECT_PATH, iface)
        exported[iface.name] = iface
    backend.team = exported
    return exported
