"""The browser harness itself, against the real Cockpit: a login through Cockpit's own
login page reaches its shell with a session of that user, a page opens in its frame,
and a wrong password is refused on the login page.

What the page's own tests build on (tests/cockpit/conftest.py, tests/support/cockpitkit.py):
headless Debian chromium on the host, cockpit.socket under the container's systemd,
PAM checking a real password. Screenshots land in test-artifacts/ (cockpitkit.ARTIFACTS).
"""

from __future__ import annotations

import pytest
from support.cockpitkit import LOGIN_ERROR, LOGIN_USER, SHELL_NAV, Browser

pytestmark = [pytest.mark.systemd, pytest.mark.slow]


def bridge_users(site) -> set[str]:
    """Whom the container's cockpit-bridge processes run as: one per live session."""
    r = site.ct.run(["ps", "-C", "cockpit-bridge", "-o", "user:32="], check=False)
    return set(r.stdout.split())


@pytest.mark.parametrize("who", ["member", "outsider"])
def test_a_login_reaches_the_shell_as_that_user(cockpit_site, who):
    login = getattr(cockpit_site, who)
    with Browser(cockpit_site.url) as b:
        b.login(login.user, login.password)
        nav = b.find(SHELL_NAV)
        assert "Overview" in nav.text
        # The shell names the session's user, and the bridge (what a page's cockpit.dbus
        # calls go through, so what polkit judges) runs as that user, not as root.
        assert b.find("#hosts-sel").text.startswith(f"{login.user}@")
        assert login.user in bridge_users(cockpit_site)
        shot = b.screenshot(f"smoke-{who}-shell")
        assert shot.stat().st_size > 10_000

        b.open_page("system/services")
        b.wait_text("systemd-journald")
        b.screenshot(f"smoke-{who}-services")


def test_wrong_password_shows_the_login_error(cockpit_site):
    with Browser(cockpit_site.url) as b:
        b.login(cockpit_site.member.user, "not-" + cockpit_site.member.password)
        error = b.find(f"#{LOGIN_ERROR}")
        b.screenshot("smoke-wrong-password")
        assert "Wrong user name or password" in error.text
        # Still on the login page, with no shell behind it.
        assert not b.driver.find_elements("css selector", SHELL_NAV)
        assert b.find(f"#{LOGIN_USER}").is_displayed()
