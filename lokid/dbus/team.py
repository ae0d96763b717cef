"""The objects lokid exports at ``/org/lokid/Lokid1``: the manager, and the team's
interfaces beside it (issue 46): ``org.lokid.Lokid1.Keys`` (the gateway's named client
keys, :mod:`lokid.dbus.keys`), ``org.lokid.Lokid1.Usage`` (who used what,
:mod:`lokid.dbus.usage`) and ``org.lokid.Lokid1.Pulls`` (models fetched to the server,
issue 48: :mod:`lokid.dbus.pulls`).

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
    for iface in exported.values():   # a part that follows work begun before this start
        adopt = getattr(iface, "adopt", None)
        if adopt is not None:
            backend.background.spawn(adopt(), f"following {iface.name}'s work again")
    return exported


async def close_team(backend: Any) -> None:
    """Close the interfaces that hold processes or tasks (the pulls' children)."""
    for iface in getattr(backend, "team", {}).values():
        close = getattr(iface, "close", None)
        if close is not None:
            await close()
