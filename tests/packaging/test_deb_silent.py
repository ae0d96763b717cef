"""Silent connections to the packaged gateway, on the aiohttp Debian ships (issue 45,
item 1): Debian 12's python3-aiohttp 3.8.4 and Debian 13's 3.11.16 arm no timer for a
connection that never sent a byte, and in the Debian 12 container 16,504 silent
connections filled the gateway's 16,384 descriptors: an honest ``/health`` timed out.

In a booted container of each release, lokid's .deb installed by apt with the
libraries of that release (python3-aiohttp, and python3-uvloop, which the package
recommends: the loop the gateway runs on there), loki-gateway.socket set up by
lokid.toml's ``[gateway] listen`` and, for the test, a drop-in ``LimitNOFILE=1024`` on
loki-gateway.service (the unit's own is 16,384: the same rule, reached with fewer
connections):

- a connection that sends nothing is closed by the gateway within its bound (30 s,
  :data:`lokid.gateway.headtimeout.SILENT_TIMEOUT`), without an answer;
- 1,100 silent connections (more than the gateway's descriptors) do not keep an honest
  ``/health`` from being answered: the longest idle are closed first, the gateway's
  descriptors stay below its limit, and its log says so.

The clients are this test's sockets (the container shares the host's network). One
container per release serves the whole module.
"""

from __future__ import annotations

import resource
import socket
import time
from collections.abc import Iterator
from dataclasses import dataclass

import pytest
from support.debpkg import SUITES, Build, cached_build, runtime_packages
from support.enginekit import free_port
from support.lowerbounds import DEBIAN_12
from support.systemd_harness import Container, _say

pytestmark = [pytest.mark.systemd, pytest.mark.slow]

# What each release ships (the versions this test is about): checked, so that a change of
# the archive is seen rather than silently tested against.
AIOHTTP = {"bookworm": "3.8.4", "trixie": "3.11.16"}
LIMIT = 1024        # the test's LimitNOFILE= for loki-gateway.service
SILENT = 30.0       # lokid.gateway.headtimeout.SILENT_TIMEOUT, as the package has it
FLOOD = 1100        # silent connections: more than LIMIT


@dataclass
class Gateway:
    ct: Container
    build: Build
    port: int


def apt(ct: Container, *args: str) -> None:
    r = ct.run(["apt-get", "-q", "-y", *args], check=False, timeout=900,
               env={"DEBIAN_FRONTEND": "noninteractive"})
    assert r.returncode == 0, f"apt-get {' '.join(args)}:\n{r.stdout[-4000:]}\n{r.stderr}"


def health(port: int, timeout: float = 10.0) -> int:
    """The status of ``GET /health`` on a fresh connection, 0 for none within ``timeout``."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
            s.sendall(b"GET /health HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
            head = s.recv(64)
    except OSError:
        return 0
    parts = head.split(b" ", 2)
    return int(parts[1]) if len(parts) > 1 and parts[1].isdigit() else 0


def gateway_pid(ct: Container) -> int:
    return int(ct.show("loki-gateway.service", "MainPID")["MainPID"])


def open_fds(ct: Container, pid: int) -> int:
    return len(ct.run(["ls", f"/proc/{pid}/fd"]).stdout.split())


def set_up(ct: Container, port: int) -> None:
    """The gateway on ``port`` with the test's descriptor limit, answering."""
    ct.write_file("/etc/loki/lokid.toml", f'[gateway]\nlisten = ["127.0.0.1:{port}"]\n')
    ct.write_file("/etc/systemd/system/loki-gateway.service.d/test-fds.conf",
                  f"[Service]\nLimitNOFILE={LIMIT}\n")
    ct.systemctl("daemon-reload")
    ct.systemctl("restart", "lokid.service")
    ct.systemctl("start", "loki-gateway.socket")
    ct.wait_for("loki-gateway.socket", "active", timeout=60)
    deadline = time.monotonic() + 60
    while health(port, 3) != 200:
        assert time.monotonic() < deadline, ct.journal("loki-gateway.service")[-3000:]
        time.sleep(0.5)


@pytest.fixture(scope="module", params=SUITES)
def gateway(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
            ) -> Iterator[Gateway]:
    suite: str = request.param
    b = cached_build(suite, tmp_path_factory.mktemp(f"deb-{suite}"))
    assert b.rc == 0, f"dpkg-buildpackage failed on {suite}:\n{b.log[-6000:]}"
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < FLOOD + 200:   # this process holds the flood's sockets
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, FLOOD + 200), hard))
    with Container(suite=suite, packages=runtime_packages(suite),
                   binds={"/debs": str(b.deb.parent)}) as ct:
        apt(ct, "update")
        apt(ct, "install", f"/debs/{b.deb.name}")
        port = free_port()
        set_up(ct, port)
        yield Gateway(ct, b, port)


def test_the_gateway_runs_on_the_releases_own_aiohttp(gateway: Gateway) -> None:
    ct, suite = gateway.ct, gateway.build.suite
    pid = gateway_pid(ct)
    maps = ct.read_file(f"/proc/{pid}/maps")
    version = ct.run(["python3", "-c", "import aiohttp; print(aiohttp.__version__)"]).stdout
    assert version.strip() == AIOHTTP[suite]
    assert "/usr/lib/python3/dist-packages/aiohttp/" in maps   # Debian's, in the gateway
    _say(f"{suite}: the gateway runs on python3-aiohttp {version.strip()}"
         f"{', uvloop' if '/uvloop/' in maps else ''}")


def test_the_lower_bounds_are_what_the_oldest_release_ships(gateway: Gateway) -> None:
    """pyproject.toml's and debian/control's bounds (tests/support/lowerbounds.py) are
    Debian 12's versions, and Debian 13 ships nothing older."""
    ct, suite = gateway.ct, gateway.build.suite
    for package, bound in DEBIAN_12.values():
        version = ct.run(["dpkg-query", "-W", "-f", "${Version}", package]).stdout
        if suite == "bookworm":
            assert version.split("-")[0] == bound, (package, version)
        newer = ct.run(["dpkg", "--compare-versions", version, "ge", bound], check=False)
        assert newer.returncode == 0, (package, version, bound)


def test_a_connection_that_sends_nothing_is_closed(gateway: Gateway) -> None:
    with socket.create_connection(("127.0.0.1", gateway.port), timeout=SILENT + 15) as s:
        t = time.monotonic()
        try:
            got = s.recv(1024)
        except TimeoutError:
            raise AssertionError(f"a silent connection still open after {SILENT + 15:g} s"
                                 ) from None
        waited = time.monotonic() - t
    assert got == b"", got                     # closed, nothing answered: it asked nothing
    assert waited < SILENT + 15
    _say(f"{gateway.build.suite}: a silent connection closed after {waited:.1f} s")


def test_silent_connections_past_the_descriptor_limit_leave_health_answered(
        gateway: Gateway) -> None:
    ct = gateway.ct
    pid = gateway_pid(ct)
    cursor = ct.cursor()
    flood: list[socket.socket] = []
    try:
        for _ in range(FLOOD):
            flood.append(socket.create_connection(("127.0.0.1", gateway.port), timeout=10))
        time.sleep(1)   # accepted, or left in the backlog where descriptors ran out
        held = open_fds(ct, pid)
        status = health(gateway.port)
        closed = 0
        for s in flood:
            s.setblocking(False)
            try:
                closed += s.recv(1) == b""
            except BlockingIOError:
                pass
            except OSError:
                closed += 1
    finally:
        for s in flood:
            s.close()
    said = ct.journal("loki-gateway.service", since_cursor=cursor)
    assert status == 200, f"/health: {status or 'no answer'} with {held} descriptors " \
        f"held\n{said[-3000:]}"
    assert LIMIT // 2 < held < LIMIT, held      # only those past the mark were closed
    assert closed >= FLOOD - LIMIT, closed     # the gateway closed them, not the kernel
    assert "near this process's limit of 1024 descriptors: closed" in said, said[-3000:]
    assert gateway_pid(ct) == pid               # the same process served it all
    _say(f"{gateway.build.suite}: {FLOOD} silent connections: the gateway held {held} "
         f"descriptors (limit {LIMIT}), closed {closed} idle ones, /health {status}")
