"""Who calls, asked of the real bus once per caller (lokid.dbus.authz): a connection's
credentials do not change and its unique name is never given again, so the second call
of the same client (the gateway's StartForRequest, each cold start) costs no round trip;
another client is asked about, and answered for, on its own."""

from __future__ import annotations

import os
from typing import Any

from dbus_fast import Message
from dbus_fast.aio import MessageBus

from lokid.dbus.authz import Authority


async def test_a_callers_credentials_are_asked_once(bus_address: str) -> None:
    bus = await MessageBus(bus_address=bus_address).connect()
    one = await MessageBus(bus_address=bus_address).connect()
    two = await MessageBus(bus_address=bus_address).connect()
    try:
        authority = Authority(bus, use_polkit=False)
        asked: list[list[Any]] = []
        real = authority._call

        async def counted(*args: Any) -> list[Any]:
            asked.append(list(args[-1]))
            return await real(*args)

        authority._call = counted  # type: ignore[method-assign]

        def call_from(client: MessageBus) -> Message:
            return Message(destination="org.lokid.Lokid1", path="/org/lokid/Lokid1",
                           interface="org.lokid.Lokid1.Manager", member="StartForRequest",
                           signature="s", body=["x"], serial=1, sender=client.unique_name)

        # this test's own user: the daemon's, who is let in without groups (None)
        assert await authority.caller(call_from(one)) is None
        assert await authority.caller(call_from(one)) is None
        assert asked == [[one.unique_name]]
        assert await authority.caller(call_from(two)) is None
        assert asked == [[one.unique_name], [two.unique_name]]
        # the bus's own answer, as it was: this process's uid
        creds = await authority._credentials_of(one.unique_name)
        assert int(creds["UnixUserID"].value) == os.getuid()
        assert len(asked) == 2
    finally:
        for b in (bus, one, two):
            b.disconnect()
