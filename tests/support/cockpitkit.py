"""A real Cockpit in the systemd test container, driven by a real browser from the host.

The Cockpit page (cockpit/, issue 23) is tested the way an operator meets it: Debian's
``cockpit-ws`` (the login page and the web service), ``cockpit-bridge`` (what a
session runs as the logged-in user) and ``cockpit-system`` (the shell: the frame and
its navigation a page lives in), installed in the booted Debian container of
tests/support/systemd_harness.py, started by its own ``cockpit.socket`` under the real
systemd, and a login through Cockpit's own login page with a real password checked by
PAM. Nothing stands in for any of it: a page that works here works on a server.

Why each step is as it is:

- The container shares the host's network, so ``cockpit.socket`` is moved off 9090 (a
  drop-in) to a free port on 127.0.0.1: two sessions (or a host's own Cockpit) never
  meet, and the host's browser reaches it at ``http://127.0.0.1:<port>/``.
- ``AllowUnencrypted`` in cockpit.conf: without TLS Cockpit redirects a browser to
  https; the test talks plain HTTP over loopback, where nothing can listen in.
- Passwords reach ``chpasswd`` on its stdin, never in an argv (ps shows argv).
- Chromium and chromedriver are the host's Debian packages (scripts/setup-system
  installs them), driven by PyPI's ``selenium``; ``--headless=new --no-sandbox`` as
  measured in /work/shared/recipes/README.md (root has no user-namespace sandbox here).
- ``chromium --screenshot`` alone returns before a page's websocket answers, so every
  wait here is for an element to appear, with a bound; a screenshot is taken on
  request and on a failed wait, into :data:`ARTIFACTS` (ignored by git), where CI can
  keep them.

    with Container(packages=COCKPIT_PACKAGES) as ct:
        cockpit = start_cockpit(ct)
        add_user(ct, "alice", "secret", groups=["loki"])
        with Browser(cockpit.url) as b:
            b.login("alice", "secret")
            b.screenshot("alice-shell")
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

from selenium import webdriver
from selenium.common.exceptions import TimeoutException, WebDriverException
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webelement import WebElement
from selenium.webdriver.support import expected_conditions as ec
from selenium.webdriver.support.ui import WebDriverWait

from .enginekit import free_port
from .systemd_harness import PACKAGES, Container

# Debian bookworm: cockpit 287; trixie: cockpit 337. cockpit-system ships the shell
# (/usr/share/cockpit/shell): without it a login ends on an empty frame with no navigation.
COCKPIT = ("cockpit-ws", "cockpit-bridge", "cockpit-system")
COCKPIT_PACKAGES = (*PACKAGES, *COCKPIT)
COCKPIT_SUITES = ("trixie", "bookworm")   # Debian 13 first: the release operators install


def cockpit_packages(suite: str) -> tuple[str, ...]:
    """The systemd tests' packages plus Cockpit, under ``suite``'s names (trixie's
    OpenSSL library is libssl3t64, its 64-bit time_t name)."""
    names = tuple("libssl3t64" if suite == "trixie" and p == "libssl3" else p
                  for p in PACKAGES)
    return (*names, *COCKPIT)

ARTIFACTS = Path(os.environ.get("LOKID_TEST_ARTIFACTS",
                                Path(__file__).resolve().parents[2] / "test-artifacts"))

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
HOST_PACKAGES = {CHROMIUM: "chromium", CHROMEDRIVER: "chromium-driver"}

# Cockpit 287's login page (static/login.html) and shell (shell/index.html).
LOGIN_USER = "login-user-input"
LOGIN_PASSWORD = "login-password-input"
LOGIN_BUTTON = "login-button"
LOGIN_ERROR = "login-error-message"
# The shell's navigation: the host's menu of pages (shell/index.html).
SHELL_NAV = "#host-apps"


class CockpitError(RuntimeError):
    """Cockpit or the browser could not be set up; the message says what to install or
    what Cockpit's journal said."""


@dataclass(frozen=True)
class Cockpit:
    """A running cockpit.socket in a container: its address on the host."""

    port: int

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/"


def start_cockpit(ct: Container, port: int | None = None, timeout: float = 30.0) -> Cockpit:
    """Start ``cockpit.socket`` in ``ct`` on 127.0.0.1:``port`` (a free one by default)
    and wait until its login page answers."""
    if ct.run(["test", "-x", "/usr/lib/cockpit/cockpit-ws"], check=False).returncode != 0:
        raise CockpitError("cockpit-ws is not in this container: boot it with "
                           "packages=COCKPIT_PACKAGES")
    port = port or free_port()
    ct.write_file("/etc/systemd/system/cockpit.socket.d/lokid-test.conf",
                  f"[Socket]\nListenStream=\nListenStream=127.0.0.1:{port}\n")
    ct.write_file("/etc/cockpit/cockpit.conf", "[WebService]\nAllowUnencrypted = true\n")
    ct.systemctl("daemon-reload")
    ct.systemctl("restart", "cockpit.socket")
    deadline = time.monotonic() + timeout
    while True:
        r = ct.run(["curl", "-sS", "-o", "/dev/null", "-w", "%{http_code}",
                    f"http://127.0.0.1:{port}/"], check=False, timeout=timeout)
        if r.stdout.strip() == "200":
            return Cockpit(port)
        if time.monotonic() > deadline:
            raise CockpitError(
                f"Cockpit on 127.0.0.1:{port} did not answer 200 in {timeout:.0f} s "
                f"(curl: {r.stdout.strip()} {r.stderr.strip()})\n--- journal\n"
                f"{ct.journal('cockpit.service')[-3000:]}")
        time.sleep(0.2)


def add_user(ct: Container, name: str, password: str, groups: Iterable[str] = ()) -> None:
    """A login user in ``ct`` with a home, bash and ``password``, a member of ``groups``
    (created as system groups when missing)."""
    groups = list(groups)
    for group in groups:
        if ct.run(["getent", "group", group], check=False).returncode != 0:
            ct.run(["groupadd", "--system", group])
    if ct.run(["getent", "passwd", name], check=False).returncode != 0:
        ct.run(["useradd", "--create-home", "--shell", "/bin/bash",
                *(["--groups", ",".join(groups)] if groups else []), name])
    elif groups:
        ct.run(["usermod", "--append", "--groups", ",".join(groups), name])
    ct.run(["chpasswd"], input=f"{name}:{password}\n")


def check_host() -> None:
    """Raise CockpitError naming the Debian packages when the browser is missing."""
    missing = sorted(pkg for path, pkg in HOST_PACKAGES.items() if not os.access(path, os.X_OK))
    if missing:
        raise CockpitError("the browser tests need Debian's chromium and its driver: "
                           f"apt-get install -y {' '.join(missing)} (scripts/setup-system)")


def _artifact_name(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", name).strip("-") or "screenshot"


class Browser:
    """Headless Chromium on the host, through chromedriver, at one Cockpit.

    Use as a context manager; each one is a fresh browser profile (no cookie of an
    earlier login).
    """

    def __init__(self, base_url: str, *, width: int = 1280, height: int = 900,
                 wait: float = 20.0) -> None:
        check_host()
        self.base_url = base_url
        self.wait = wait
        self.size = (width, height)
        self._driver: webdriver.Chrome | None = None

    def __enter__(self) -> Browser:
        options = webdriver.ChromeOptions()
        options.binary_location = CHROMIUM
        for arg in ("--headless=new", "--no-sandbox", "--disable-gpu",
                    "--disable-dev-shm-usage", f"--window-size={self.size[0]},{self.size[1]}"):
            options.add_argument(arg)
        options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
        try:
            self._driver = webdriver.Chrome(options=options, service=Service(CHROMEDRIVER))
        except WebDriverException as e:   # its message carries chromedriver's own words
            raise CockpitError(f"cannot start headless chromium through chromedriver: {e}") \
                from e
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if self._driver is not None:
            self._driver.quit()
            self._driver = None

    @property
    def driver(self) -> webdriver.Chrome:
        """Selenium's driver, for what this class does not wrap."""
        assert self._driver is not None, "use Browser as a context manager"
        return self._driver

    # --- navigation ------------------------------------------------------------------

    def open(self, path: str = "") -> None:
        """Load ``path``, relative to Cockpit's root (``cockpit/@localhost/lokid/index.html``,
        or ``""`` for the login page or the shell)."""
        self.driver.get(self.base_url + path.lstrip("/"))

    def find(self, css: str, timeout: float | None = None) -> WebElement:
        """The first element matching ``css`` once it is displayed. On a timeout a
        screenshot ``timeout-…`` is saved and AssertionError says where, with the browser's
        log."""
        wait = timeout or self.wait
        try:
            found: WebElement = WebDriverWait(self.driver, wait).until(
                ec.visibility_of_element_located((By.CSS_SELECTOR, css)))
        except TimeoutException:
            shot = self.screenshot(f"timeout-{css}")
            raise AssertionError(f"no visible {css!r} at {self.driver.current_url} after "
                                 f"{wait:.0f} s; screenshot {shot}; browser log:\n"
                                 f"{self.log()}") from None
        return found

    def login(self, user: str, password: str) -> None:
        """Fill in Cockpit's login page and press Log in. It does not wait for the
        outcome: :meth:`find` :data:`SHELL_NAV` or ``#``:data:`LOGIN_ERROR` after it."""
        self.open()
        name = self.find(f"#{LOGIN_USER}")
        name.clear()
        name.send_keys(user)
        self.find(f"#{LOGIN_PASSWORD}").send_keys(password)
        self.find(f"#{LOGIN_BUTTON}").click()

    def open_page(self, path: str, timeout: float | None = None) -> None:
        """Open the shell at ``path`` (a package and page: ``lokid``, ``system/services``)
        and switch into that page's frame: the shell runs each page in an iframe named
        ``cockpit1:localhost/<path>``, and what a page draws is only found inside it."""
        self.top()
        self.open(path)
        self.driver.switch_to.frame(
            self.find(f'iframe[name="cockpit1:localhost/{path.strip("/")}"]', timeout))

    def wait_text(self, text: str, timeout: float | None = None) -> str:
        """Wait until ``text`` is in what the current frame shows; all of that text. On a
        timeout, a screenshot and AssertionError with what was shown instead."""
        wait = timeout or self.wait
        deadline = time.monotonic() + wait
        while True:
            shown = str(self.driver.execute_script("return document.body.innerText"))
            if text in shown:
                return shown
            if time.monotonic() > deadline:
                shot = self.screenshot(f"timeout-text-{text[:40]}")
                raise AssertionError(f"{text!r} not shown after {wait:.0f} s; screenshot "
                                     f"{shot}; shown:\n{shown[-2000:]}\nbrowser log:\n"
                                     f"{self.log()}")
            time.sleep(0.1)

    def wait_js(self, script: str, *args: object, timeout: float | None = None,
                what: str = "") -> object:
        """Wait until ``script`` (a function body run in the current frame, ``return …``,
        with ``args`` as ``arguments``) returns something truthy; that value. On a timeout,
        a screenshot and AssertionError naming ``what`` (or the script), with the browser's
        log."""
        wait = timeout or self.wait
        deadline = time.monotonic() + wait
        while True:
            value = self.driver.execute_script(script, *args)
            if value:
                return value
            if time.monotonic() > deadline:
                shot = self.screenshot(f"timeout-js-{(what or script)[:40]}")
                raise AssertionError(f"{what or script!r} not true after {wait:.0f} s; "
                                     f"screenshot {shot}; browser log:\n{self.log()}")
            time.sleep(0.05)

    def login_to_page(self, user: str, password: str, path: str = "lokid") -> float:
        """Log in, wait for the shell, and open ``path`` in its frame; the time.monotonic()
        at which the shell appeared (a page's first paint is measured from there)."""
        self.login(user, password)
        self.find(SHELL_NAV, timeout=60)
        shell = time.monotonic()
        self.open_page(path)
        return shell

    def open_preset(self, name: str) -> None:
        """From the lokid page's overview to preset ``name``'s view, as a click on its name
        does, once its view's header is drawn. A click the overview's redraw took (its row
        replaced as the click landed: a full run saw the page stay on the overview for
        20 s, once) is made again, at most twice, as a person would."""
        from selenium.common.exceptions import StaleElementReferenceException

        link = f"tr[data-preset='{name}'] a.lk-name"
        # the row's link itself, not the name's text: the waiting card names a preset
        # before the presets table has drawn its row (test_page_queues, alone)
        self.find(link)
        for attempt in range(3):
            try:
                self.driver.find_element("css selector", link).click()
                self.find("#lk-preset-name", timeout=None if attempt == 2 else 8)
                return
            except (AssertionError, StaleElementReferenceException):
                if attempt == 2:
                    raise

    def top(self) -> None:
        """Back to the shell from a page's frame."""
        self.driver.switch_to.default_content()

    # --- what the browser saw -----------------------------------------------------------

    def screenshot(self, name: str) -> Path:
        """Save a PNG of the window as ``ARTIFACTS/<name>.png``; its path."""
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        path = ARTIFACTS / f"{_artifact_name(name)}.png"
        if not self.driver.save_screenshot(str(path)):
            raise AssertionError(f"the browser could not write the screenshot {path}")
        return path

    def log(self) -> str:
        """The browser console's messages so far (page errors, CSP refusals)."""
        try:
            entries = self.driver.get_log("browser")
        except WebDriverException:   # a log is a diagnostic, never a failure of its own
            return ""
        return "\n".join(f"{e.get('level')}: {e.get('message')}" for e in entries)
