"""``lokictl keys`` against lokid.service under a real systemd (issue 46, item 1): the
shipped tmpfiles entry makes /etc/loki/clients 0750 root:loki-gateway, the unit's
ReadWritePaths lets the hardened daemon write there and nowhere else in /etc, the file is
0640 root:loki-gateway (the gateway's user reads it, others do not), and the real polkitd
with the shipped action and rules lets group loki manage keys and refuses the gateway's
own user and nobody, naming the action."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
from support.lokid_install import LokidSystem, install
from support.systemd_harness import Container

pytestmark = [pytest.mark.systemd, pytest.mark.engine, pytest.mark.slow]

KEYS = "/etc/loki/clients/keys.toml"


@pytest.fixture(scope="module")
def lk(systemd_container: Container, container_engine: str) -> Iterator[LokidSystem]:
    system = install(systemd_container, container_engine)
    yield system
    systemd_container.run(["rm", "-f", KEYS], check=False)
    systemd_container.systemctl("stop", "lokid.service", check=False)
    system.cleanup()


def lokictl_as(ct: Container, user: str | None, *args: str) -> Any:
    argv = ["env", "PYTHONPATH=/opt/lokid", "python3", "-m", "lokid.ctl", "keys", *args]
    if user == "nobody":
        argv = ["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups", *argv]
    elif user:
        argv = ["setpriv", f"--reuid={user}", f"--regid={user}", "--init-groups", *argv]
    return ct.run(argv, check=False, timeout=120)


def member_of_loki(ct: Container) -> str:
    if ct.run(["getent", "passwd", "keyops"], check=False).returncode != 0:
        ct.run(["useradd", "--create-home", "--user-group", "--groups", "loki", "keyops"])
    return "keyops"


def test_keys_under_systemd(lk: LokidSystem) -> None:
    ct = lk.ct
    ct.systemctl("start", "lokid.service")
    ct.wait_for("lokid.service", "active", timeout=60)
    cursor = ct.cursor()
    r = ct.run(["stat", "-c", "%a %U %G", "/etc/loki/clients"])
    assert r.stdout.split() == ["750", "root", "loki-gateway"], r.stdout

    r = lokictl_as(ct, None, "add", "ci", "--models", "demo*", "--rpm", "60")
    assert r.returncode == 0, (r.stdout, r.stderr)
    (secret,) = r.stdout.split()
    r = ct.run(["stat", "-c", "%a %U %G", KEYS])
    assert r.stdout.split() == ["640", "root", "loki-gateway"], r.stdout
    assert secret not in ct.read_file(KEYS) and "hash = \"sha256:" in ct.read_file(KEYS)
    # the gateway's user reads the file itself; nobody does not
    assert ct.run(["setpriv", "--reuid=loki-gateway", "--regid=loki-gateway",
                   "--init-groups", "cat", KEYS], check=False).returncode == 0
    assert ct.run(["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups",
                   "cat", KEYS], check=False).returncode != 0

    member = member_of_loki(ct)
    r = lokictl_as(ct, member, "rotate", "ci", "--grace", "1h")
    assert r.returncode == 0, (r.stdout, r.stderr)
    r = lokictl_as(ct, member, "list")
    assert r.returncode == 0 and r.stdout.splitlines()[1].startswith("ci "), r
    for user in ("loki-gateway", "nobody"):
        r = lokictl_as(ct, user, "list")
        assert r.returncode == 3, (user, r.stdout, r.stderr)
        assert "not authorized by polkit for org.lokid.lokid1.manage-keys" in r.stderr, r
        assert r.stdout == ""
    r = lokictl_as(ct, "loki-gateway", "add", "intruder")
    assert r.returncode == 3 and "intruder" not in ct.read_file(KEYS), r
    time.sleep(0.5)
    journal = ct.journal("lokid.service", since_cursor=cursor)
    assert secret not in journal and "Traceback" not in journal
