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
Where dbus-fast is right (Debian 13, PyPI), non-ASCII text is sent as it is.

Two things no D-Bus string may hold are escaped on every dbus-fast: a NUL
character, and a lone surrogate (what Python makes of a file name that is not
UTF-8, such as a preset file ``\xff.toml`` listed as broken). dbus-fast would
raise while marshalling, and the daemon with it.

It also writes through :mod:`lokid.dbus.buswriter` (a full socket buffer is a wait,
not the end of the connection), and says why it was lost (:meth:`SafeMessageBus.lost`):
a daemon without its bus is no daemon, and exits for systemd to start it again.
"""

from __future__ import annotations

import asyncio
import functools
from typing import Any

from dbus_fast import Message, Variant
from dbus_fast.aio import MessageBus

from . import buswriter

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
        return text.replace("\0", "\\u0000")
    return "".join(c if c.isascii() and c != "\0" else LOOKALIKES.get(c) or
                   (f"\\u{ord(c):04x}" if ord(c) <= 0xFFFF else f"\\U{ord(c):08x}")
                   for c in text)


def wire_text(text: str, ascii_only: bool = False) -> str:
    """``text`` as a D-Bus string may hold it: in ASCII when ``ascii_only`` (above); else
    only a NUL or a lone surrogate escaped (``\\u0000``, ``\\udcff``)."""
    if ascii_only or text.isascii():
        return ascii_text(text)
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return ascii_text(text)
    return text.replace("\0", "\\u0000")


def ascii_value(value: Any, ascii_only: bool = True) -> Any:
    """``value`` (a message body or part of one) with every string made sendable by
    :func:`wire_text` (in ASCII unless ``ascii_only`` is false)."""
    if isinstance(value, str):
        return wire_text(value, ascii_only)
    if isinstance(value, Variant):
        return Variant(value.signature, ascii_value(value.value, ascii_only))
    if isinstance(value, list):
        return [ascii_value(v, ascii_only) for v in value]
    if isinstance(value, tuple):
        return tuple(ascii_value(v, ascii_only) for v in value)
    if isinstance(value, dict):
        return {ascii_value(k, ascii_only): ascii_value(v, ascii_only) for k, v in value.items()}
    return value


def _seen(future: asyncio.Future[Any]) -> None:
    """Mark a finished future's exception as retrieved."""
    if not future.cancelled():
        future.exception()


class SafeMessageBus(MessageBus):
    """dbus-fast's asyncio bus, writing message bodies in ASCII where it must (above),
    waiting out a full socket buffer, and saying why it ends."""

    def __init__(self, *args: Any, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.why_lost: str | None = None
        buswriter.adopt(getattr(self, "_writer", None), self.lose)   # dbus-fast < 5
        # The reason a connection ended is :meth:`lost`'s to say; when nobody waits for it
        # any more (the daemon's wait given up for a stop under way), asyncio logged it at
        # collection as "Future exception was never retrieved", traceback and all
        self._disconnect_future.add_done_callback(_seen)

    async def connect(self) -> SafeMessageBus:
        await super().connect()
        buswriter.adopt(self._writer, self.lose)   # dbus-fast 5 makes its writer here
        return self

    @property
    def ended(self) -> bool:
        """Whether the connection has ended (dbus-fast resolved its disconnect future)."""
        return bool(self._disconnect_future.done())

    def send(self, msg: Message) -> Any:
        if self.ended:
            # dbus-fast before 5 goes on writing to a connection it ended (its socket
            # stays open): a message sent now goes nowhere, and says so by nothing.
            done = asyncio.get_running_loop().create_future()
            done.set_result(None)
            return done
        msg.body = ascii_value(msg.body, not marshals_utf8_by_bytes())
        return super().send(msg)

    async def call(self, msg: Message) -> Message:
        """As dbus-fast's, but refused at once once the connection has ended: dbus-fast
        before 5 would wait for ever for a reply no one reads (a daemon's last
        Unsubscribe to systemd held its exit until systemd killed it)."""
        if self.ended:
            raise ConnectionError(f"not connected to the bus ({self.why_lost or 'ended'})")
        return await super().call(msg)

    def lose(self, why: str) -> None:
        """End the connection for ``why`` (the first reason given is kept)."""
        if self.why_lost is None:
            self.why_lost = why
        self.disconnect()

    async def lost(self) -> str:
        """Wait until the connection ends, for whatever reason (this process's
        :meth:`disconnect` included); then say why, in words."""
        try:
            await self.wait_for_disconnect()  # type: ignore[no-untyped-call]
        except Exception as e:
            return self.why_lost or f"the connection failed: {type(e).__name__}: {e}"
        return self.why_lost or "the bus closed the connection"
