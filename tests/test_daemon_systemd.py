"""lokid.service under a real systemd with the real system bus (Debian 12: dbus-fast 1.84).

The daemon runs as the loki user with its hardening, owns org.lokid.Lokid1 by the
shipped bus policy, is started by D-Bus activation, and anyone may read from it.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

import pytest
from lokid_install import LokidSystem, install
from systemd_harness import Container

pytestmark = [pytest.mark.systemd, pytest.mark.engine, pytest.mark.slow]

BUS = "org.lokid.Lokid1"
PATH = "/org/lokid/Lokid1"
MANAGER = "org.lokid.Lokid1.Manager"
EXPOSURE_GOAL = 3.0


@pytest.fixture(scope="module")
def lk(systemd_container: Container, container_engine: str, models: Any
       ) -> Iterator[LokidSystem]:
    system = install(systemd_container, container_engine, [models.llama])
    system.preset("demo", 'model = "llama.gguf"\n')
    yield system
    systemd_container.systemctl("stop", "lokid.service", check=False)
    system.cleanup()


def busctl(ct: Container, *args: str, user: str | None = None) -> Any:
    argv = ["busctl", "--json=short", *args]
    if user:
        argv = ["setpriv", f"--reuid={user}", "--regid=nogroup", "--clear-groups", *argv]
    return ct.run(argv, check=False)


def test_the_daemon_starts_on_the_first_call_and_serves_the_presets(lk: LokidSystem) -> None:
    ct = lk.ct
    ct.systemctl("stop", "lokid.service", check=False)
    r = busctl(ct, "get-property", BUS, PATH, MANAGER, "Presets")
    assert r.returncode == 0, r.stderr  # D-Bus activation started lokid.service
    assert json.loads(r.stdout)["data"] == ["/org/lokid/Lokid1/preset/demo"]
    props = lk.ct.run(["systemctl", "show", "lokid.service", "-p", "ActiveState,MainPID,"
                       "StatusText"]).stdout
    assert "ActiveState=active" in props and "StatusText=serving 1 presets" in props
    pid = re.search(r"MainPID=(\d+)", props)
    assert pid is not None
    user = ct.run(["ps", "-o", "user=", "-p", pid.group(1)]).stdout.strip()
    assert user == "loki"
    r = busctl(ct, "call", BUS, PATH, MANAGER, "GetPreset", "s", "demo")
    assert json.loads(r.stdout)["data"] == ["/org/lokid/Lokid1/preset/demo"], r.stderr
    r = busctl(ct, "introspect", BUS, "/org/lokid/Lokid1/preset/demo")
    assert ".Plan" in r.stdout and ".Argv" in r.stdout, r.stderr


def test_anyone_may_read_but_only_root_or_loki_may_own_the_name(lk: LokidSystem) -> None:
    ct = lk.ct
    ct.systemctl("start", "lokid.service")
    r = busctl(ct, "get-property", BUS, PATH, MANAGER, "Version", user="nobody")
    assert r.returncode == 0, r.stderr
    r = busctl(ct, "call", BUS, "/org/lokid/Lokid1/preset/demo", "org.lokid.Lokid1.Preset",
               "Plan", user="nobody")
    assert r.returncode == 0 and '"argv"' in r.stdout, r.stderr
    owner = ct.run(["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups",
                    "python3", "-c", "import sys; sys.path.insert(0, '/opt/lokid');"
                    "import asyncio; from dbus_fast.aio import MessageBus;"
                    "from dbus_fast import BusType\n"
                    "async def main():\n"
                    "    bus = await MessageBus(bus_type=BusType.SYSTEM).connect()\n"
                    "    print((await bus.request_name('org.lokid.Lokid1')).name)\n"
                    "asyncio.run(main())"], check=False)
    assert owner.returncode != 0, owner
    assert 'not allowed to own the service "org.lokid.Lokid1"' in owner.stderr, owner.stderr
    # deny by default: a member the policy does not list never reaches the daemon
    r = busctl(ct, "call", BUS, PATH, MANAGER, "StartPreset", "s", "demo", user="nobody")
    assert r.returncode != 0 and "Access denied" in r.stderr, r.stderr


def test_hardening_exposure(lk: LokidSystem) -> None:
    r = lk.ct.run(["systemd-analyze", "security", "--no-pager", "lokid.service"], check=False)
    m = re.search(r"Overall exposure level for lokid\.service: (\d+\.\d+)", r.stdout)
    assert m, r.stdout[-2000:]
    exposure = float(m.group(1))
    print(f"\nsystemd-analyze security lokid.service: {exposure}")
    assert exposure <= EXPOSURE_GOAL, r.stdout
