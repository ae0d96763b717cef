"""The daemon's bus connection, safe with Debian 12's dbus-fast for any text it sends.

dbus-fast before its fix for multi-byte strings (Bluetooth-Devices/dbus-fast#261,
October 2023; Debian 12 ships 1.84.2) writes a string's length in characters,
not in UTF-8 bytes. One non-ASCII character in anything the daemon sends (the
"→" of a plan note, a model path with an accent, an error quoting a caller's
argument) makes a malformed message, and the bus daemon drops the connection:
lokid.service died at its first InterfacesAdded, and any local user could kill
it with ``busctl call … GetPreset s é``.

:class:`SafeMessageBus` checks once which dbus-fast it has, by marshalling a
two-byte character. Where the length comes out wrong, every string of every
message body leaving the daemon is written in ASCII first: common typographic
characters as their look-alikes ("→" as "->"), anything else as ``\\uXXXX``.
Where dbus-fast is right (Debian 13, PyPI), nothing is changed.
"""

from __future__ import annotations

import functools
from typing import Any

from dbus_fast import Message, Variant
from dbus_fast.aio import MessageBus

LOOKALIKES = {
    "→": "->", "←": "<-", "…": "...", "—": "-", "–": "-", "×": "x", "·": "-", "≤": "<=",
    "≥": ">=", "‘": "'", "’": "'", "“": '"', "”": '"', "\u00a0": " ",
}


@functools.cache
def marshals_utf8_by_bytes() -> bool:
    """Whether this dbus-fast writes a string's length in bytes, as D-Bus says."""
    from dbus_fast._private.marshaller import Marshaller

    data = bytes(Marshaller("s", ["é"]).marshall())   # 1 character, 2 bytes
    return 2 in (int.from_bytes(data[:4], "little"), int.from_bytes(data[:4], "big"))


def ascii_text(text: str) -> str:
    if text.isascii():
        return text
    return "".join(c if c.isascii() else LOOKALIKES.get(c) or
                   (f"\\u{ord(c):04x}" if ord(c) <= 0xFFFF else f"\\U{ord(c):08x}")
                   for c in text)


def ascii_value(value: Any) -> Any:
    """``value`` (a message body or part of one) with every string in ASCII."""
    if isinstance(value, str):
        return ascii_text(value)
    if isinstance(value, Variant):
        return Variant(value.signature, ascii_value(value.value))
    if isinstance(value, list):
        return [ascii_value(v) for v in value]
    if isinstance(value, tuple):
        return tuple(ascii_value(v) for v in value)
    if isinstance(value, dict):
        return {ascii_value(k): ascii_value(v) for k, v in value.items()}
    return value


class SafeMessageBus(MessageBus):
    """dbus-fast's asyncio bus, writing message bodies in ASCII where it must (above)."""

    def send(self, msg: Message) -> Any:
        if not marshals_utf8_by_bytes():
            msg.body = ascii_value(msg.body)
        return super().send(msg)
