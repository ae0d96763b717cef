"""The RPC worker's fence under real systemd (issue 45, item 7): loki-rpc@w.service from
the packaged unit and the generator's drop-in, the real ``ggml-rpc-server``, in the
session's container (which shares this machine's network). The worker listens on a LAN
address of this machine and its one head is written as 127.0.0.2 (a head on this host,
so the test can be it). A local user's process that binds 127.0.0.1, or none, and
connects to the worker is dropped by the kernel; the head's address is answered. With
``IPAddressAllow=localhost`` always added (before item 7), 127.0.0.1 got the hello, and
holding that connection made a head's engine fail to start ("busy")."""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Iterator
from typing import Any

import pytest
from support.enginekit import free_port
from support.lokid_install import LokidSystem, install
from support.systemd_harness import Container

pytestmark = [pytest.mark.systemd, pytest.mark.slow]

# Connects from ``source`` (or the kernel's choice) as the calling user, sends the RPC
# protocol's HELLO and prints what came back: "answered 7.x.y", or why not.
PROBE = r"""
import socket, struct, sys
source, host, port = sys.argv[1], sys.argv[2], int(sys.argv[3])
s = socket.socket()
s.settimeout(3)
try:
    if source:
        s.bind((source, 0))
    s.connect((host, port))
    s.sendall(bytes([14]) + struct.pack("<Q", 24) + bytes(24))
    head = s.recv(8)
    size = struct.unpack("<Q", head)[0]
    body = s.recv(size)
    print(f"answered {body[0]}.{body[1]}.{body[2]}")
except OSError as e:
    print(f"no answer: {type(e).__name__} {e}")
"""


def lan_address() -> str | None:
    """An IPv4 address of this machine that is not loopback (the route to a TEST-NET
    address picks it; no packet is sent), or None."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(("192.0.2.123", 9))
        except OSError:
            return None
        address = str(s.getsockname()[0])
    return None if address.startswith("127.") or address == "0.0.0.0" else address


@pytest.fixture
def lk(systemd_container: Container, container_engine: str) -> Iterator[LokidSystem]:
    system = install(systemd_container, container_engine)
    try:
        yield system
    finally:
        system.cleanup()


def hello_from(ct: Container, source: str, endpoint: str) -> str:
    host, port = endpoint.rsplit(":", 1)
    r = ct.run(["runuser", "-u", "nobody", "--", "python3", "-c", PROBE, source, host, port],
               timeout=30, check=False)
    return (r.stdout + r.stderr).strip()


def test_only_the_configured_head_reaches_the_worker_no_other_local_user(
        lk: LokidSystem) -> None:
    address = lan_address()
    if address is None:
        pytest.skip("this machine has no IPv4 address beyond loopback for the worker to "
                    "listen on")
    ct = lk.ct
    endpoint = f"{address}:{free_port()}"
    ct.run(["mkdir", "-p", "/etc/loki/rpc"])
    ct.write_file("/etc/loki/rpc/fence.toml",
                  f'listen = "{endpoint}"\nheads = ["127.0.0.2"]\nthreads = 1\n')
    lk.track_path("/etc/loki/rpc/fence.toml")
    lk.track_unit("loki-rpc@fence.service")
    lk.reload()
    ct.systemctl("start", "loki-rpc@fence.service", timeout=60)
    ct.wait_for("loki-rpc@fence.service", "active", timeout=30)

    said: dict[str, Any] = {}
    for _ in range(50):   # the server binds its port just after the unit is active
        said["head"] = hello_from(ct, "127.0.0.2", endpoint)
        if said["head"].startswith("answered"):
            break
        time.sleep(0.2)
    assert said["head"].startswith("answered 7."), said
    # another local user: from 127.0.0.1, and from the worker's own address
    said["127.0.0.1"] = hello_from(ct, "127.0.0.1", endpoint)
    said["lan"] = hello_from(ct, "", endpoint)
    assert said["127.0.0.1"].startswith("no answer"), json.dumps(said)
    assert said["lan"].startswith("no answer"), json.dumps(said)
    # the head still reaches it afterwards: nothing local held it
    assert hello_from(ct, "127.0.0.2", endpoint).startswith("answered 7."), said
    allowed = ct.show("loki-rpc@fence.service", "IPAddressAllow")["IPAddressAllow"]
    assert allowed.split() == ["127.0.0.2/32"], allowed
