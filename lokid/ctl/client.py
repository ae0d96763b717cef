"""The bus client of lokictl: one connection (the local bus, or another machine's over
ssh), the calls every command makes, and how a D-Bus error becomes an exit status.

``--host [USER@]HOST[:PORT]`` reaches lokid on another machine the way
``busctl -H`` does: ``ssh -xT HOST systemd-stdio-bridge`` carries the system
bus (``$SYSTEMD_SSH`` names another ssh, as for systemd's tools). dbus-fast
knows no ``unixexec:`` address, so lokictl listens on a private socket and
hands the connection it accepts to ssh as its stdin and stdout.

Exit status: 0 ok, 1 failed (daemon unreachable, engine failed), 2 usage or
invalid preset, 3 permission denied, 4 not found.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

from dbus_fast import DBusError
from dbus_fast.aio import MessageBus

from ..core import errors
from ..core.names import (
    BUS_NAME,
    MANAGER_INTERFACE,
    OBJECT_PATH,
    PRESET_INTERFACE,
)
from ..dbus.wire import SafeMessageBus
from ..host.buscall import call, plain

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_PERMISSION, EXIT_NOT_FOUND = 0, 1, 2, 3, 4


class CtlError(Exception):
    def __init__(self, message: str, code: int):
        super().__init__(message)
        self.code = code


def exit_code_of(error: DBusError) -> int:
    name = error.type or ""
    if name in (errors.NOT_FOUND, "org.freedesktop.DBus.Error.UnknownObject"):
        return EXIT_NOT_FOUND
    if name in (errors.PERMISSION_DENIED, "org.freedesktop.DBus.Error.AccessDenied"):
        return EXIT_PERMISSION
    if name in (errors.INVALID_PRESET, errors.INVALID_ARGS):
        return EXIT_USAGE
    return EXIT_FAILED


class Client:
    def __init__(self, bus: MessageBus):
        self.bus = bus

    async def _call(self, path: str, interface: str, member: str, signature: str = "",
                    body: Sequence[Any] = ()) -> list[Any]:
        return await call(self.bus, BUS_NAME, path, interface, member, signature, body)

    async def properties(self, path: str, interface: str) -> dict[str, Any]:
        (props,) = await self._call(path, "org.freedesktop.DBus.Properties", "GetAll", "s",
                                    [interface])
        return {k: plain(v) for k, v in props.items()}

    async def add_match(self, rule: str) -> None:
        await call(self.bus, "org.freedesktop.DBus", "/org/freedesktop/DBus",
                   "org.freedesktop.DBus", "AddMatch", "s", [rule])

    async def manager(self, member: str, signature: str = "",
                      body: Sequence[Any] = ()) -> list[Any]:
        return await self._call(OBJECT_PATH, MANAGER_INTERFACE, member, signature, body)

    async def preset_path(self, name: str) -> str:
        (path,) = await self._call(OBJECT_PATH, MANAGER_INTERFACE, "GetPreset", "s", [name])
        return str(path)

    async def plan(self, name: str) -> dict[str, Any]:
        path = await self.preset_path(name)
        (plan,) = await self._call(path, PRESET_INTERFACE, "Plan")
        return dict(plain(plan))


def ssh_argv(host: str) -> list[str]:
    """What busctl -H runs: ssh -xT [-p PORT] -- [USER@]HOST systemd-stdio-bridge."""
    import os

    ssh = os.environ.get("SYSTEMD_SSH") or "ssh"
    target, port = host, ""
    if host.count(":") == 1:  # HOST:PORT (an IPv6 address has several)
        target, port = host.split(":")
    if not target or target.startswith("-"):
        raise CtlError(f"--host {host!r}: not a host name", EXIT_USAGE)
    return [ssh, "-xT", *(["-p", port] if port else []), "--", target,
            "systemd-stdio-bridge"]


async def close(bus: MessageBus, ssh: asyncio.subprocess.Process | None) -> None:
    """Disconnect, and let the ssh carrying the connection end (killed after 5 s)."""
    bus.disconnect()
    if ssh is not None:
        try:
            await asyncio.wait_for(ssh.wait(), 5)
        except TimeoutError:
            ssh.kill()


async def connect_over_ssh(host: str) -> tuple[MessageBus, asyncio.subprocess.Process]:
    """A bus connection through ssh: a private socket whose one connection ssh carries."""
    import os
    import socket
    import tempfile

    argv = ssh_argv(host)
    loop = asyncio.get_running_loop()
    with tempfile.TemporaryDirectory(prefix="lokictl-") as tmp:
        path = os.path.join(tmp, "bus")
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            listener.bind(path)
            listener.listen(1)
            listener.setblocking(False)
            connecting = asyncio.ensure_future(SafeMessageBus(bus_address=f"unix:path={path}")
                                               .connect())
            conn, _ = await loop.sock_accept(listener)
        finally:
            listener.close()
        with conn:
            conn.setblocking(True)
            try:
                ssh = await asyncio.create_subprocess_exec(*argv, stdin=conn.fileno(),
                                                           stdout=conn.fileno())
            except OSError as e:
                connecting.cancel()
                raise CtlError(f"cannot run {argv[0]}: {e.strerror}", EXIT_FAILED) from None
        try:
            return await connecting, ssh
        except (OSError, EOFError, ValueError) as e:
            raise CtlError(f"cannot reach lokid on {host} over ssh: {e or 'connection closed'}",
                           EXIT_FAILED) from None

