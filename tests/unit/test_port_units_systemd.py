"""An on-demand preset's own port under a real systemd (issue 22, item 4):
``loki-port@<preset>.socket`` (the generator's ListenStream= and link) holds the port,
the first connection starts ``loki-port@<preset>.service`` (systemd-socket-proxyd),
which starts the engine and relays only once it is ready: the client's request waits
and is answered, never refused nor 502. A stop of the engine, by the daemon's idle stop
or by hand, leaves the port listening, and the next request starts it again.

Generous bounds only: the container shares a noisy machine.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
from support.lokid_install import LokidSystem, install, unit
from support.systemd_harness import Container

pytestmark = [pytest.mark.systemd, pytest.mark.engine, pytest.mark.slow]

SOCKET, RELAY = "loki-port@lazy.socket", "loki-port@lazy.service"


@pytest.fixture(scope="module")
def lk(systemd_container: Container, container_engine: str, models: Any
       ) -> Iterator[LokidSystem]:
    ct = systemd_container
    # install() lays out loki-port@.socket and .service where the package does
    system = install(ct, container_engine, [models.llama])
    system.track_unit(RELAY)
    system.track_unit(SOCKET)
    system.lazy_port = system.preset(  # type: ignore[attr-defined]
        "lazy", 'model = "llama.gguf"\n[serve]\non_demand = true\nidle_stop = "4s"\n')
    yield system
    ct.systemctl("stop", SOCKET, RELAY, check=False)
    ct.systemctl("stop", "lokid.service", check=False)
    system.cleanup()


def lokictl(ct: Container, *args: str, timeout: float = 180) -> Any:
    return ct.run(["env", "PYTHONPATH=/opt/lokid", "python3", "-m", "lokid.ctl", *args],
                  check=False, timeout=timeout)


def state(ct: Container, name: str) -> str:
    return ct.show(name, "ActiveState")["ActiveState"]


def asked(lk: LokidSystem, port: int) -> float:
    """One chat request to the preset's port (curl fails on a refusal or a 5xx); the
    seconds it took."""
    t0 = time.monotonic()
    reply = lk.chat(port, "Hello", max_tokens=8)
    assert reply["choices"][0]["message"]["content"] is not None, reply
    return time.monotonic() - t0


def test_the_port_starts_the_engine_waits_for_it_and_outlives_its_stops(lk: LokidSystem
                                                                        ) -> None:
    ct, port = lk.ct, lk.lazy_port  # type: ignore[attr-defined]
    assert f"ListenStream=127.0.0.1:{port}" in ct.systemctl("cat", SOCKET).stdout
    wants = ct.systemctl("show", "-p", "Wants", "--value", "sockets.target").stdout
    assert SOCKET in wants.split(), wants
    # what boot does: sockets.target pulls in what the generator enabled
    ct.systemctl("start", "sockets.target")
    ct.wait_for(SOCKET, "active", timeout=30)
    ct.systemctl("start", "lokid.service")
    ct.wait_for("lokid.service", "active", timeout=60)
    assert state(ct, unit("lazy")) == "inactive" and state(ct, RELAY) == "inactive"
    cursor = ct.cursor()

    # the first request waits in the backlog while the engine starts, and is answered
    asked(lk, port)
    assert state(ct, unit("lazy")) == "active" and state(ct, RELAY) == "active"
    relay_pid = ct.show(RELAY, "MainPID")["MainPID"]
    # systemd's relay, as loki: no Python in the byte path
    assert ct.run(["ps", "-o", "user=", "-p", relay_pid]).stdout.strip() == "loki"
    assert ct.read_file(f"/proc/{relay_pid}/cmdline").split("\0")[:2] == \
        ["/usr/lib/systemd/systemd-socket-proxyd", "/run/loki/lazy.sock"]
    # the engine listens on its socket, not on the port
    argv = ct.read_file(f"/proc/{lk.engine_pid('lazy')}/cmdline").split("\0")
    assert argv[argv.index("--host") + 1] == "/run/loki/lazy.sock" and "--port" not in argv
    assert lk.runtime_plan("lazy")["socket"] == "/run/loki/lazy.sock"
    journal = lk.journal("lazy", since_cursor=cursor)
    assert f"on demand: systemd holds port {port} ({SOCKET})" in journal, journal[-3000:]

    # lokictl shows the client's URL, and the daemon's benchmark reaches the engine
    # through the port (the relay)
    r = lokictl(ct, "presets")
    assert r.returncode == 0 and f"http://127.0.0.1:{port}" in r.stdout, (r.stdout, r.stderr)
    r = lokictl(ct, "bench", "lazy", "--json")
    assert r.returncode == 0, (r.stdout[-2000:], r.stderr[-2000:])

    # the daemon's idle stop: the engine stops, the relay with it, the port stays
    ct.wait_for(unit("lazy"), "inactive", timeout=60)
    ct.wait_for(RELAY, "inactive", timeout=30)
    assert state(ct, SOCKET) == "active"
    assert "stopped after 4s without a request" in ct.journal("lokid.service",
                                                             since_cursor=cursor)
    asked(lk, port)
    assert state(ct, unit("lazy")) == "active" and state(ct, RELAY) == "active"

    # a stop by hand: lokictl says the port stays open, and it does
    r = lokictl(ct, "stop", "lazy", "--wait")
    assert r.returncode == 0 and r.stdout.startswith("lazy: inactive"), (r.stdout, r.stderr)
    assert "lazy is on demand: the next request starts it again" in r.stderr, r.stderr
    assert state(ct, RELAY) == "inactive" and state(ct, SOCKET) == "active"
    asked(lk, port)
    assert state(ct, unit("lazy")) == "active"
    for name in (unit("lazy"), RELAY, SOCKET, "lokid.service"):
        assert "Traceback" not in ct.journal(name, since_cursor=cursor)


def test_a_preset_that_cannot_start_closes_connections_at_once(lk: LokidSystem) -> None:
    """Its engine's start fails (no model): the client's connection is closed, not left
    in the backlog until the client gives up, and a second connection starts nothing
    (no start per connection)."""
    ct = lk.ct
    port = lk.preset("bad", 'model = "missing.gguf"\n[serve]\non_demand = true\n')
    socket, relay = "loki-port@bad.socket", "loki-port@bad.service"
    ct.systemctl("start", socket)
    ct.wait_for(socket, "active", timeout=30)
    curl = ["curl", "-sS", "--max-time", "60", "-o", "/dev/null", "-w", "%{http_code}",
            f"http://127.0.0.1:{port}/health"]
    t0 = time.monotonic()
    r = ct.run(curl, check=False, timeout=90)
    took = time.monotonic() - t0
    # curl 52 (empty reply) or 56 (reset): closed by the relay, never 28 (timed out)
    assert r.returncode in (52, 56) and r.stdout == "000", (r.returncode, r.stderr, took)
    assert took < 45, took
    assert state(ct, unit("bad")) in ("failed", "inactive")
    starts = ct.show(unit("bad"), "InvocationID")["InvocationID"]
    r = ct.run(curl, check=False, timeout=90)
    assert r.returncode in (52, 56), (r.returncode, r.stderr)
    assert ct.show(unit("bad"), "InvocationID")["InvocationID"] == starts
    assert state(ct, socket) == "active" and state(ct, relay) == "active"
    ct.systemctl("stop", socket, relay, check=False)


def test_a_reload_opens_a_new_on_demand_port_and_closes_one_turned_off(lk: LokidSystem
                                                                       ) -> None:
    """The operator's steps with lokid.service running: a preset made on demand and a
    daemon-reload, and its port listens (the daemon starts the socket the reload only
    loaded, lokid.runners.portsockets); turned off while its engine runs, the socket
    stays and the daemon says why; once the engine stopped, a reload closes it."""
    ct = lk.ct
    ct.systemctl("start", "lokid.service")
    ct.wait_for("lokid.service", "active", timeout=60)
    cursor = ct.cursor()
    body = 'model = "llama.gguf"\n'
    port = lk.preset("fresh", body + "[serve]\non_demand = true\n")   # and daemon-reload
    socket = "loki-port@fresh.socket"
    ct.wait_for(socket, "active", timeout=30)
    asked(lk, port)
    assert state(ct, unit("fresh")) == "active"
    # while its engine runs, turning on_demand off only says what to do
    lk.preset("fresh", body, port=port)
    time.sleep(3)
    assert state(ct, socket) == "active"
    ct.systemctl("stop", unit("fresh"), timeout=60)
    lk.reload()
    ct.wait_for(socket, "inactive", timeout=30)
    journal = ct.journal("lokid.service", since_cursor=cursor)
    assert f"{socket}: start" in journal and f"{socket}: stop" in journal, journal[-3000:]
    assert "Traceback" not in journal
    # the port is the engine's own again
    ct.systemctl("start", unit("fresh"), timeout=120)
    asked(lk, port)
    argv = ct.read_file(f"/proc/{lk.engine_pid('fresh')}/cmdline").split("\0")
    assert argv[argv.index("--host") + 1] == "127.0.0.1"
    ct.systemctl("stop", unit("fresh"), timeout=60)
