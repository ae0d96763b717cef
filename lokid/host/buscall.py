"""One D-Bus method call with dbus-fast's low-level API: the reply's body, or a DBusError.

The daemon's authorisation (:mod:`lokid.dbus.authz`), its systemd runner
(:mod:`lokid.runners.systemd_runner`) and ``lokictl`` call other services without proxy
objects (no introspection round trip); this is the one place that turns an
error reply into an exception with its name and message, and :func:`plain` the one
that turns a reply's Variants into plain Python values.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from dbus_fast import DBusError, Message, MessageType, Variant
from dbus_fast.aio import MessageBus

FAILED = "org.freedesktop.DBus.Error.Failed"


async def call(bus: MessageBus, destination: str, path: str, interface: str, member: str,
               signature: str = "", body: Sequence[Any] = ()) -> list[Any]:
    reply = await bus.call(Message(destination=destination, path=path, interface=interface,
                                   member=member, signature=signature, body=list(body)))
    if reply is None:
        raise DBusError("org.freedesktop.DBus.Error.NoReply", f"no reply from {destination}")
    if reply.message_type == MessageType.ERROR:
        name = reply.error_name or FAILED
        raise DBusError(name, str(reply.body[0] if reply.body else name))
    return list(reply.body)


def plain(value: Any) -> Any:
    """dbus-fast Variants, recursively, as plain Python values (for JSON)."""
    if isinstance(value, Variant):
        return plain(value.value)
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [plain(v) for v in value]
    return value
