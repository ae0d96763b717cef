"""The systemd runner's thrash-hint sampler against the two answers systemd gives.

systemd counts a unit's disk reads only where the io controller is on the unified
cgroup hierarchy; the CI host is hybrid (cgroup v1 controllers), so its real systemd
(tests/dbus/test_daemon_systemd.py) only ever says "unknown" (UINT64_MAX). The answer
with figures is checked here against a stand-in for the part of systemd's D-Bus API
that the sampler reads (Manager.GetUnit, the Service properties IOReadBytes and
MemoryCurrent), with the values and errors systemd documents. No postponed
annotations: dbus-fast reads the signature strings.
"""

from typing import Any

import pytest
from dbus_fast import DBusError, PropertyAccess
from dbus_fast.aio import MessageBus
from dbus_fast.service import ServiceInterface, dbus_property, method

from lokid.core.bench.iosample import IOSample
from lokid.runners.systemd_runner import SYSTEMD, SYSTEMD_PATH, UNKNOWN, SystemdRunner

UNIT_PATH = SYSTEMD_PATH + "/unit/loki_2dengine_40demo_2eservice"


class Manager(ServiceInterface):
    def __init__(self) -> None:
        super().__init__(SYSTEMD + ".Manager")

    @method()
    def GetUnit(self, name: "s") -> "o":  # noqa: F821 - D-Bus signatures
        if name != "loki-engine@demo.service":
            raise DBusError(SYSTEMD + ".NoSuchUnit", f"Unit {name} not loaded.")
        return UNIT_PATH


class Service(ServiceInterface):
    def __init__(self) -> None:
        super().__init__(SYSTEMD + ".Service")
        self.read = 0
        self.memory = 0

    @dbus_property(access=PropertyAccess.READ)
    def IOReadBytes(self) -> "t":  # noqa: F821
        return self.read

    @dbus_property(access=PropertyAccess.READ)
    def MemoryCurrent(self) -> "t":  # noqa: F821
        return self.memory


@pytest.fixture
async def systemd(bus_address: str) -> Any:
    """(the stand-in's Service, the runner on the same bus)."""
    stand_in = await MessageBus(bus_address=bus_address).connect()
    service = Service()
    stand_in.export(SYSTEMD_PATH, Manager())
    stand_in.export(UNIT_PATH, service)
    await stand_in.request_name(SYSTEMD)
    bus = await MessageBus(bus_address=bus_address).connect()
    yield service, SystemdRunner(bus, lambda *a: None)
    bus.disconnect()
    stand_in.disconnect()


async def test_known_counters_are_sampled_as_they_move(systemd: Any) -> None:
    service, runner = systemd
    service.read, service.memory = 1 << 20, 3 << 30
    sampler = await runner.io_sampler("demo")
    assert sampler is not None
    label = "memory of loki-engine@demo.service (its cgroup, page cache included)"
    assert await sampler() == IOSample(1 << 20, 3 << 30, label)
    service.read = 5 << 30
    assert await sampler() == IOSample(5 << 30, 3 << 30, label)
    service.memory = UNKNOWN  # the reads alone: the memory is not invented
    assert await sampler() == IOSample(5 << 30, None, label)


async def test_unknown_reads_or_no_unit_give_no_sampler(systemd: Any) -> None:
    service, runner = systemd
    service.read, service.memory = UNKNOWN, 3 << 30
    assert await runner.io_sampler("demo") is None
    assert await runner.io_sampler("absent") is None
    service.read = 0
    sampler = await runner.io_sampler("demo")
    assert sampler is not None
    service.read = UNKNOWN  # e.g. accounting switched off since
    assert await sampler() is None


def test_a_stopped_unit_keeps_no_status_of_its_ended_run() -> None:
    """systemd keeps a unit's StatusText until its next start: the "stopping" its engine
    said last was shown as the Status of an inactive preset (issue 20, item 10). A failed
    unit's text stays: it says why it failed."""
    from lokid.runners.runner import EngineState

    seen: list[EngineState] = []
    runner = SystemdRunner(None, lambda _p, state: seen.append(state))  # type: ignore[arg-type]
    runner.props["demo"] = {"ActiveState": "deactivating", "SubState": "stop-sigterm",
                            "StatusText": "stopping"}
    runner._publish("demo")
    assert seen[-1] == EngineState("stopping", "stopping", "")
    runner.props["demo"].update(ActiveState="inactive", SubState="dead", Result="success")
    runner._publish("demo")
    assert seen[-1] == EngineState("inactive", "", "")
    runner.props["demo"].update(ActiveState="failed", SubState="failed", Result="exit-code",
                                StatusText="cannot start: port 80 is below 1024")
    runner._publish("demo")
    assert seen[-1].status == "cannot start: port 80 is below 1024"
