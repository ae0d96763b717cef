"""The daemon in the test's event loop and a dbus-fast client of it, for the daemon tests."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

from dbus_fast import BusType
from dbus_fast.aio import MessageBus

from lokid.core.names import BUS_NAME, MANAGER_INTERFACE, OBJECT_PATH
from lokid.dbus.daemon import Daemon


class Running:
    def __init__(self, daemon: Daemon, client: MessageBus):
        self.daemon = daemon
        self.client = client
        self.events: list[tuple[str, str, str]] = []   # EngineStateChanged, in order
        self.jobs: dict[str, tuple[str, ...]] = {}      # JobFinished by job id

    async def iface(self, path: str, interface: str) -> Any:
        intro = await self.client.introspect(BUS_NAME, path)
        return self.client.get_proxy_object(BUS_NAME, path, intro).get_interface(interface)

    async def wait_job(self, job: str, timeout: float = 120) -> tuple[str, ...]:
        """JobFinished of ``job``: (preset, job, verb, result, state, detail)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if job in self.jobs:
                return self.jobs[job]
            await asyncio.sleep(0.02)
        raise AssertionError(f"job {job} did not end in {timeout} s: {self.jobs}")

    async def wait_event(self, preset: str, state: str, timeout: float = 120,
                         after: int = 0) -> tuple[str, str, str]:
        """The first EngineStateChanged(preset, state, …) from event number ``after`` on."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for ev in self.events[after:]:
                if ev[0] == preset and ev[1] == state:
                    return ev
            await asyncio.sleep(0.05)
        raise AssertionError(f"no {state} for {preset} in {timeout} s: {self.events}")


async def owned(client: MessageBus) -> bool:
    intro = await client.introspect("org.freedesktop.DBus", "/org/freedesktop/DBus")
    dbus = client.get_proxy_object("org.freedesktop.DBus", "/org/freedesktop/DBus", intro)
    return bool(await dbus.get_interface("org.freedesktop.DBus").call_name_has_owner(BUS_NAME))


@contextlib.contextmanager
def private_bus(root: Path) -> Iterator[str]:
    """A private session bus (the real dbus-daemon, its socket ``root``/bus): its address."""
    import subprocess

    proc = subprocess.Popen(["dbus-daemon", "--session", "--nofork", "--print-address",
                             f"--address=unix:path={root / 'bus'}"],
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    address = proc.stdout.readline().strip()
    try:
        assert address.startswith("unix:"), address
        yield address
    finally:
        proc.terminate()
        proc.wait(10)


@contextlib.asynccontextmanager
async def daemon_on(config: Path, root: Path, bus_address: str,
                    prepare: Callable[[Daemon], None] | None = None, **kw: Any
                    ) -> AsyncIterator[Running]:
    """lokid's daemon on a private bus (its local runner: a session bus), until the block ends."""
    daemon = Daemon(str(config), str(root / "state"), str(root / "run"), BusType.SESSION,
                    bus_address, **kw)
    if prepare is not None:
        prepare(daemon)
    task = asyncio.get_running_loop().create_task(daemon.run())
    client = await asyncio.wait_for(MessageBus(bus_address=bus_address).connect(), 30)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if task.done():
            task.result()
        if await owned(client):
            break
        await asyncio.sleep(0.05)
    running = Running(daemon, client)
    manager = await running.iface(OBJECT_PATH, MANAGER_INTERFACE)
    manager.on_engine_state_changed(lambda *ev: running.events.append(tuple(ev)))
    manager.on_job_finished(lambda *ev: running.jobs.__setitem__(ev[1], tuple(ev)))
    try:
        yield running
    finally:
        daemon.stopping.set()
        await asyncio.wait_for(task, 120)
        client.disconnect()
