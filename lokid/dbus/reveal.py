"""Property reads that may carry secrets, answered with the caller's own rights.

A preset's command line can hold secret values (``--api-key sk-…`` typed into
``extra_args``), and its environment tokens. A caller without the right to
edit presets (:data:`lokid.core.names.ACTION_EDIT`, group ``loki`` by the
shipped rules) must get them masked (:func:`lokid.core.config.secrets.mask_argv`), a
caller with it in clear: the same right guards the preset's file, so nobody
learns over the bus what they could not read on disk.

Methods know their caller (:mod:`lokid.dbus.authz`), but dbus-fast answers
``org.freedesktop.DBus.Properties.Get``/``GetAll`` itself and calls a
property's getter without saying who asks. So :class:`Revealer`, a message
handler that runs before dbus-fast's own, takes the ``Get`` of each property
in :data:`SECRET_PROPERTIES` and the ``GetAll`` of the Preset interface (a
handler that returns True has handled the message), decides the caller's
right without prompting (:meth:`~lokid.dbus.authz.Authority.allows`), and
answers with the getters called while :func:`revealed` says so. Every other
message goes on to dbus-fast untouched. A fault is an error reply, never
silence: the caller would hang until its timeout.

Signals (``PropertiesChanged``) go to every listener on the bus: their values
are always masked; a client with the right reads the property again.
"""

from __future__ import annotations

import contextvars
import logging
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

from dbus_fast import DBusError, Message, MessageType, Variant
from dbus_fast.service import ServiceInterface

from ..core.errors import LokiError, dbus_name
from ..core.names import PRESET_INTERFACE

log = logging.getLogger("lokid.dbus")

PROPERTIES = "org.freedesktop.DBus.Properties"
# Preset properties whose values may hold secrets (each getter masks unless revealed()).
SECRET_PROPERTIES = frozenset({"Argv", "RunningArgv"})

_revealed: contextvars.ContextVar[bool] = contextvars.ContextVar("lokid_reveal",
                                                                 default=False)


def revealed() -> bool:
    """Whether the property being read may show secret values to its caller."""
    return _revealed.get()


class Revealer:
    """Answers the secret-bearing property reads of the Preset objects (see above)."""

    def __init__(self, bus: Any, allows: Callable[[Message], Awaitable[bool]],
                 find: Callable[[str], ServiceInterface | None],
                 spawn: Callable[[Coroutine[Any, Any, None], str], object]):
        self.bus = bus
        self.allows = allows      # may this call's sender see secrets
        self.find = find          # the Preset interface exported at a path, or None
        self.spawn = spawn

    def install(self) -> None:
        self.bus.add_message_handler(self.handle)

    def handle(self, msg: Message) -> bool:
        if msg.message_type != MessageType.METHOD_CALL or msg.interface != PROPERTIES:
            return False
        if msg.member == "Get" and msg.signature == "ss":
            interface, prop = msg.body
            if interface != PRESET_INTERFACE or prop not in SECRET_PROPERTIES:
                return False
        elif msg.member == "GetAll" and msg.signature == "s":
            if msg.body[0] != PRESET_INTERFACE:
                return False
        else:
            return False
        iface = self.find(msg.path or "")
        if iface is None:
            return False  # dbus-fast says there is no such object
        self.spawn(self._answer(msg, iface), f"answering {msg.member} of {msg.path}")
        return True

    async def _answer(self, msg: Message, iface: ServiceInterface) -> None:
        try:
            allowed = await self.allows(msg)
        except Exception:  # the failure mode is "masked", never "shown"
            log.exception("cannot tell whether %s may read secrets", msg.sender)
            allowed = False
        token = _revealed.set(allowed)
        try:
            reply = self._reply(msg, iface)
        except DBusError as e:
            reply = Message.new_error(msg, e.type, e.text)
        except LokiError as e:
            reply = Message.new_error(msg, dbus_name(e), str(e))
        except Exception:
            log.exception("reading the properties of %s", msg.path)
            reply = Message.new_error(msg, "org.freedesktop.DBus.Error.Failed",
                                      "internal error in lokid; details are in its log")
        finally:
            _revealed.reset(token)
        self.bus.send(reply)

    @staticmethod
    def _reply(msg: Message, iface: ServiceInterface) -> Message:
        props = {p.name: p.signature for p in iface.introspect().properties}
        if msg.member == "Get":
            name = msg.body[1]
            return Message.new_method_return(msg, "v", [Variant(props[name],
                                                                getattr(iface, name))])
        values = {name: Variant(sig, getattr(iface, name)) for name, sig in props.items()}
        return Message.new_method_return(msg, "a{sv}", [values])
