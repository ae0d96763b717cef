"""lokid.dbus.wire: what the daemon sends stays valid with Debian 12's dbus-fast.

The real bug needs dbus-fast 1.84 (tests/dbus/test_daemon_systemd.py meets it in the
bookworm container); here, on a real private bus, the conversion itself and that it
happens only where the installed dbus-fast gets UTF-8 lengths wrong.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from dbus_fast import Message, MessageType, Variant
from dbus_fast.aio import MessageBus

from lokid.dbus import wire


def test_ascii_text_uses_look_alikes_then_escapes() -> None:
    assert wire.ascii_text("plain") == "plain"
    assert wire.ascii_text("auto → MTP … 2×") == "auto -> MTP ... 2x"
    assert wire.ascii_text("modèle 🦙") == "mod\\u00e8le \\U0001f999"


def test_ascii_value_walks_containers_and_variants() -> None:
    value = [{"é": Variant("as", ["→"])}, ("ü", 3), Variant("a{sv}", {"k": Variant("s", "…")})]
    out = wire.ascii_value(value)
    assert out[0] == {"\\u00e9": Variant("as", ["->"])}
    assert out[1] == ("\\u00fc", 3)
    assert out[2] == Variant("a{sv}", {"k": Variant("s", "...")})


def test_the_installed_dbus_fast_writes_byte_lengths() -> None:
    # PyPI's dbus-fast (this venv) has the fix: the daemon must send text unchanged.
    assert wire.marshals_utf8_by_bytes()


def test_nul_and_lone_surrogates_are_escaped_on_every_dbus_fast() -> None:
    # a key "\u0000" in a preset, a preset file named b"\xff.toml" (listed as broken)
    for ascii_only in (False, True):
        assert wire.wire_text("a\0b", ascii_only) == "a\\u0000b"
        assert wire.wire_text("\udcff.toml", ascii_only) == "\\udcff.toml"
    assert wire.wire_text("modèle → x") == "modèle → x"


@pytest.mark.parametrize("buggy", [False, True])
async def test_a_signal_arrives_whole_and_in_ascii_only_where_needed(
        bus_address: str, monkeypatch: pytest.MonkeyPatch, buggy: bool) -> None:
    monkeypatch.setattr(wire, "marshals_utf8_by_bytes", lambda: not buggy)
    sender = await wire.SafeMessageBus(bus_address=bus_address).connect()
    receiver = await MessageBus(bus_address=bus_address).connect()
    got: asyncio.Future[Any] = asyncio.get_running_loop().create_future()

    def on_message(msg: Message) -> None:
        if msg.message_type == MessageType.SIGNAL and msg.member == "Said":
            got.set_result(msg.body)

    receiver.add_message_handler(on_message)
    await receiver.call(Message(destination="org.freedesktop.DBus", path="/org/freedesktop/DBus",
                                interface="org.freedesktop.DBus", member="AddMatch",
                                signature="s", body=["type='signal',member='Said'"]))
    await sender.send(Message.new_signal("/t", "org.lokid.Test", "Said", "sv",
                                         ["auto → MTP", Variant("as", ["modèle", "k\0\udcff"])]))
    body = await asyncio.wait_for(got, 10)
    if buggy:
        assert body == ["auto -> MTP", Variant("as", ["mod\\u00e8le", "k\\u0000\\udcff"])]
    else:
        assert body == ["auto → MTP", Variant("as", ["modèle", "k\\u0000\\udcff"])]
    sender.disconnect()
    receiver.disconnect()
