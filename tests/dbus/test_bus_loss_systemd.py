"""lokid.service and the system bus under a real systemd (issue 28, item 14; Debian 12's
dbus-fast 1.84.2 in the container).

- The system bus stopped (SIGSTOP of its dbus-daemon) while a preset is added to 200:
  the reload's burst fills the daemon's socket (EAGAIN). The daemon waits and, once
  the bus reads again, answers with the new preset, the same process. Before, dbus-fast
  dropped the connection on EAGAIN and lokid lived on, its name dead (on 1.84 the
  socket stays open: calls to it time out), its watchdog pinged from the loop, and
  systemd never restarted it.
- The system bus killed (SIGKILL of its dbus-daemon; dbus.socket starts a new one on
  the next connection): the daemon logs why it ends and exits 1, systemd restarts it
  (Restart=on-failure, no start limit), and org.lokid.Lokid1 answers again. Before, it
  lived on without a connection and nothing brought it back.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import pytest
from support.lokid_install import LokidSystem, install
from support.systemd_harness import Container

pytestmark = [pytest.mark.systemd, pytest.mark.engine, pytest.mark.slow]

BUS = "org.lokid.Lokid1"
PATH = "/org/lokid/Lokid1"
MANAGER = "org.lokid.Lokid1.Manager"
PRESETS = 200


@pytest.fixture(scope="module")
def lk(systemd_container: Container, container_engine: str, models: Any
       ) -> Iterator[LokidSystem]:
    system = install(systemd_container, container_engine, [models.llama])
    for i in range(PRESETS):
        system.write_preset_text(f"p{i:03d}", f'model = "llama.gguf"\nctx = 2048\n'
                                 f"port = {21000 + i}\n", reload=False)
    system.reload()
    yield system
    systemd_container.systemctl("stop", "lokid.service", check=False)
    systemd_container.systemctl("reset-failed", "lokid.service", check=False)
    system.cleanup()


def presets(ct: Container) -> list[str] | None:
    """The daemon's Presets, asked as any client asks; None when it does not answer."""
    r = ct.run(["busctl", "--json=short", "--timeout=10", "get-property", BUS, PATH, MANAGER,
                "Presets"], check=False, timeout=30)
    if r.returncode != 0:
        return None
    data: list[str] = json.loads(r.stdout)["data"]
    return data


def wait_answers(ct: Container, with_preset: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while True:
        got = presets(ct)
        if got is not None and f"{PATH}/preset/{with_preset}" in got:
            return
        assert time.monotonic() < deadline, (
            f"org.lokid.Lokid1 does not answer with {with_preset} ({got!r:.200})\n"
            + ct.journal("lokid.service")[-3000:])
        time.sleep(0.5)


def bus_pid(ct: Container) -> str:
    pid = ct.show("dbus.service", "MainPID")["MainPID"]
    assert pid not in ("", "0"), ct.show("dbus.service", "ActiveState")
    return pid


def started(lk: LokidSystem) -> dict[str, str]:
    ct = lk.ct
    ct.systemctl("start", "lokid.service", timeout=300)
    wait_answers(ct, "p000", 120)
    return ct.show("lokid.service", "MainPID", "NRestarts")


def test_a_stalled_bus_is_waited_for(lk: LokidSystem) -> None:
    ct = lk.ct
    before = started(lk)
    cursor = ct.cursor()
    pid = bus_pid(ct)
    ct.run(["kill", "-STOP", pid])
    try:
        # the daemon sees the file by itself (inotify): no daemon-reload while stopped
        lk.write_preset_text("added", 'model = "llama.gguf"\nctx = 2048\nport = 21999\n',
                             reload=False)
        ct.wait_journal("lokid.service", f"presets loaded: serving {PRESETS + 1} presets",
                        since_cursor=cursor, timeout=60)
        time.sleep(1)   # the loop turns, its writer facing a full socket
    finally:
        ct.run(["kill", "-CONT", pid])
    wait_answers(ct, "added", 60)
    assert ct.show("lokid.service", "MainPID", "NRestarts") == before
    log = ct.journal("lokid.service", since_cursor=cursor)
    assert "BlockingIOError" not in log and "lost the bus" not in log, log[-3000:]


def test_a_lost_bus_ends_the_daemon_and_systemd_brings_it_back(lk: LokidSystem) -> None:
    ct = lk.ct
    before = started(lk)
    cursor = ct.cursor()
    ct.run(["kill", "-KILL", bus_pid(ct)])
    ct.wait_journal("lokid.service", "lost the bus, and with it org.lokid.Lokid1",
                    since_cursor=cursor, timeout=60)
    # the next connection (lokid's restart, busctl's) starts dbus again through dbus.socket
    wait_answers(ct, "p000", 180)
    after = ct.show("lokid.service", "MainPID", "NRestarts")
    assert int(after["NRestarts"]) > int(before["NRestarts"]), (before, after)
    assert after["MainPID"] != before["MainPID"]
    log = ct.journal("lokid.service", since_cursor=cursor)
    assert "status=1/FAILURE" in log, log[-3000:]
    assert "Traceback" not in log, log[-3000:]
