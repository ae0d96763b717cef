"""A preset's replicas under a real systemd (issue 47): lokid.service starts
``loki-engine@rep.service`` and ``loki-engine@rep:2.service`` (the generator's drop-in
for each), each engine answers on its own port, a replica whose engine is killed is
restarted by its own unit (the preset's engine untouched), StartReplica adds
``loki-engine@rep:3.service``, and StopPreset stops every one.

lokid laid out as its package does, the repository's code (tests/support/lokid_install.py).
Generous bounds only: the container shares a noisy machine.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from support.enginekit import free_ports
from support.lokid_install import LokidSystem, install, unit
from support.systemd_harness import Container

pytestmark = [pytest.mark.systemd, pytest.mark.engine, pytest.mark.slow]

BUS = "org.lokid.Lokid1"
MANAGER = "org.lokid.Lokid1.Manager"


@pytest.fixture(scope="module")
def lk(systemd_container: Container, container_engine: str, models: Any
       ) -> Iterator[LokidSystem]:
    system = install(systemd_container, container_engine, [models.llama])
    yield system
    systemd_container.systemctl("stop", "lokid.service", check=False)
    system.cleanup()


def busctl(ct: Container, *args: str) -> Any:
    r = ct.run(["busctl", "--json=short", *args], check=False, timeout=90)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)["data"] if r.stdout.strip() else None


def replicas(ct: Container) -> dict[int, dict[str, Any]]:
    data = busctl(ct, "get-property", BUS, "/org/lokid/Lokid1/preset/rep",
                  "org.lokid.Lokid1.Preset", "Replicas")
    return {row["index"]["data"]: {k: v["data"] for k, v in row.items()} for row in data}


def test_replicas_are_units_restarted_on_their_own_and_stopped_together(
        lk: LokidSystem) -> None:
    ct = lk.ct
    port = free_ports(3)
    lk.preset("rep", 'model = "llama.gguf"\n[serve]\nreplicas = 2\nmax_replicas = 3\n',
              port=port)
    for k in (2, 3):
        lk.track_unit(unit(f"rep:{k}"))
        lk.track_path(f"/run/loki/rep:{k}.json")
    ct.systemctl("restart", "lokid.service")
    ct.wait_for("lokid.service", "active", timeout=30)
    assert ct.show(unit("rep:2"), "Description")["Description"] == \
        "lokid engine rep:2: llama.gguf"   # the generator's drop-in for the replica

    busctl(ct, "call", BUS, "/org/lokid/Lokid1", MANAGER, "StartPreset", "s", "rep")
    for name in ("rep", "rep:2"):
        ct.wait_for(unit(name), "active", timeout=120)
    assert (lk.health(port), lk.health(port + 1), lk.health(port + 2)) == (200, 200, 0)
    assert lk.runtime_plan("rep:2")["port"] == port + 1
    running = ct.run(["systemctl", "list-units", "--plain", "--no-legend", "--state=active",
                      "loki-engine@rep*"]).stdout
    assert sorted(line.split()[0] for line in running.splitlines()) == [
        unit("rep"), unit("rep:2")]
    rows = replicas(ct)
    assert {k: (r["unit"], r["state"], r["port"]) for k, r in rows.items()} == {
        1: (unit("rep"), "ready", port), 2: (unit("rep:2"), "ready", port + 1)}

    # a replica's engine killed: its own unit restarts it; the preset's engine runs on
    own = lk.engine_pid("rep")
    ct.run(["kill", "-KILL", str(lk.engine_pid("rep:2"))])
    lk.wait_restarts("rep:2", 1, timeout=90)
    ct.wait_for(unit("rep:2"), "active", timeout=120)
    assert lk.health(port + 1) == 200
    assert lk.engine_pid("rep") == own and lk.show("rep", "NRestarts")["NRestarts"] == "0"

    assert busctl(ct, "call", BUS, "/org/lokid/Lokid1", MANAGER, "StartReplica", "s",
                  "rep") == [3]
    ct.wait_for(unit("rep:3"), "active", timeout=120)
    assert lk.health(port + 2) == 200

    busctl(ct, "call", BUS, "/org/lokid/Lokid1", MANAGER, "StopPreset", "s", "rep")
    for name in ("rep", "rep:2", "rep:3"):
        ct.wait_for(unit(name), "inactive", timeout=120)
    assert (lk.health(port), lk.health(port + 1), lk.health(port + 2)) == (0, 0, 0)
    journal = ct.journal("lokid.service")
    assert "Traceback" not in journal, journal[-3000:]
