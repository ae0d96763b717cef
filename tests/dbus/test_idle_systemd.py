"""Idle stop under a real systemd: the engine's request lines reach lokid.service through the
journal, and a preset with serve.idle_stop is stopped (its loki-engine@ unit, as
``lokictl stop`` does) once it has had no request in flight for that long, an open
connection without a request notwithstanding; a preset without idle_stop runs on.

Generous bounds only: the container shares a noisy machine.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import pytest
from support.lokid_install import LokidSystem, install, unit
from support.systemd_harness import Container

pytestmark = [pytest.mark.systemd, pytest.mark.engine, pytest.mark.slow]

BUS = "org.lokid.Lokid1"
PRESET = "org.lokid.Lokid1.Preset"
HOLD = """
import socket, sys, time
s = socket.create_connection(("127.0.0.1", int(sys.argv[1])))
print("open", flush=True)
time.sleep(120)
"""


@pytest.fixture(scope="module")
def lk(systemd_container: Container, container_engine: str, models: Any
       ) -> Iterator[LokidSystem]:
    system = install(systemd_container, container_engine, [models.llama])
    system.idle_port = system.preset(  # type: ignore[attr-defined]
        "idler", 'model = "llama.gguf"\n[serve]\nidle_stop = "3s"\n')
    system.preset("steady", 'model = "llama.gguf"\n')
    yield system
    systemd_container.systemctl("stop", "lokid.service", check=False)
    system.cleanup()


def prop(ct: Container, name: str, prop_name: str) -> Any:
    r = ct.run(["busctl", "--json=short", "get-property", BUS,
                f"/org/lokid/Lokid1/preset/{name}", PRESET, prop_name], check=False)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)["data"]


def test_an_idle_engine_is_stopped_through_the_journal_and_counted(lk: LokidSystem) -> None:
    ct = lk.ct
    ct.systemctl("restart", "lokid.service")
    ct.wait_for("lokid.service", "active", timeout=30)
    assert prop(ct, "idler", "IdleStop") == 3.0 and prop(ct, "steady", "IdleStop") == 0.0
    cursor = ct.cursor()
    ct.systemctl("start", unit("steady"), unit("idler"), timeout=120)
    port = lk.idle_port  # type: ignore[attr-defined]
    holder = ct.popen(["python3", "-c", HOLD, str(port)])   # a connection, never a request
    try:
        lk.chat(port, "Hello", max_tokens=16)
        ended = time.monotonic()
        # a second request restarts the clock: the stop counts from its end
        time.sleep(1.5)
        lk.chat(port, "Again", max_tokens=16)
        ended = time.monotonic()
        assert ct.show(unit("idler"), "ActiveState")["ActiveState"] == "active"
        ct.wait_for(unit("idler"), "inactive", timeout=40)
        waited = time.monotonic() - ended
    finally:
        holder.stop()
    assert 2.0 <= waited <= 40, waited
    journal = ct.journal("lokid.service", since_cursor=cursor)
    assert "preset idler: stopped after 3s without a request (serve.idle_stop)" in journal, \
        journal[-3000:]
    assert "Traceback" not in journal
    stats = prop(ct, "idler", "Stats")
    assert stats["idle_stops"]["data"] == 1, stats
    assert prop(ct, "idler", "IdleStopAt") == 0.0
    # the preset without idle_stop is still serving, a while after
    time.sleep(4)
    assert ct.show(unit("steady"), "ActiveState")["ActiveState"] == "active"
    assert prop(ct, "steady", "IdleStopAt") == 0.0
    ct.systemctl("stop", unit("steady"), timeout=60)
