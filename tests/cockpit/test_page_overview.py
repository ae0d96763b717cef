"""The page's overview and a preset's view in a real browser, logged into the real Cockpit
as a member of group loki and as a user outside it, over the real lokid.service, systemd
and engine of the container (tests/cockpit/conftest.py).

What an operator does there: the overview lists every preset (a broken one with its
reason) and follows a start made from a shell, without a reload; Start on the page
starts the unit; a non-member's Start is refused in polkit's words and nothing starts;
a preset's view shows its plan, its journal and its state. Screenshots are kept in
test-artifacts/ (tests/support/cockpitkit.py).
"""

from __future__ import annotations

import json
import time

import pytest
from support.cockpitkit import ARTIFACTS, Browser
from support.lokid_install import unit

pytestmark = [pytest.mark.systemd, pytest.mark.engine, pytest.mark.slow]

MODEL = 'model = "llama.gguf"\n'


def row_state(b: Browser, name: str) -> str:
    return str(b.driver.execute_script(
        "const r = document.querySelector(`tr[data-preset='${arguments[0]}'] .lk-state`);"
        "return r ? r.textContent : '';", name))


def wait_state(b: Browser, name: str, states: tuple[str, ...], timeout: float) -> float:
    """Wait until the row of ``name`` shows one of ``states``; when (time.monotonic())."""
    b.wait_js("const r = document.querySelector(`tr[data-preset='${arguments[0]}'] .lk-state`);"
              "return r && arguments[1].includes(r.textContent);", name, list(states),
              timeout=timeout, what=f"{name} shows {states}")
    return time.monotonic()


def click_in_row(b: Browser, name: str, label: str) -> None:
    for button in b.driver.find_elements("css selector", f"tr[data-preset='{name}'] button"):
        if button.text == label:
            button.click()
            return
    raise AssertionError(f"no {label} button in the row of {name}")


def active(lokid, name: str, timeout: float) -> str:
    deadline = time.monotonic() + timeout
    while True:
        state = lokid.show(name, "ActiveState")["ActiveState"]
        if state == "active" or time.monotonic() > deadline:
            return state
        time.sleep(0.5)


def test_the_overview_lists_every_preset_and_follows_a_start_from_a_shell(
        cockpit_site, lokid, capsys):
    lokid.preset("alpha", MODEL, reload=False)
    lokid.preset("beta", MODEL, reload=False)
    lokid.write_preset_text("broken", "ctx = [not toml\n")
    with Browser(cockpit_site.url) as b:
        b.login_to_page(cockpit_site.member.user, cockpit_site.member.password)
        shown = b.wait_text("beta")
        assert "alpha" in shown and "broken" in shown
        assert row_state(b, "alpha") == "inactive"
        # the broken preset's row is its reason, as the daemon words it
        b.wait_js("return [...document.querySelectorAll('.lk-error')]"
                  ".some(e => e.textContent.includes('broken.toml'))",
                  what="the broken preset's reason")
        b.screenshot("overview-member")

        # From a shell: the row follows without a reload (signals, never a poll).
        cockpit_site.ct.systemctl("start", "--no-block", unit("alpha"))
        asked = time.monotonic()
        seen = wait_state(b, "alpha", ("loading", "ready"), timeout=10)
        with capsys.disabled():
            print(f"\n[cockpit] systemctl start -> the row's state moved in "
                  f"{seen - asked:.2f} s")
        wait_state(b, "alpha", ("ready",), timeout=120)
        # under the state, the engine's live status ("ready: alpha (llama.gguf) at …"),
        # not the last word of its loading
        b.wait_js("const d = document.querySelector(\"tr[data-preset='alpha'] .lk-cell-state "
                  ".lk-muted\"); return d && d.textContent.startsWith('ready: alpha')",
                  what="alpha's status line")
        b.wait_js("const r = document.querySelector(\"tr[data-preset='alpha'] .lk-cell-url\");"
                  "return r && r.textContent.startsWith('http')", what="alpha's URL")
        b.screenshot("overview-alpha-ready")
        assert row_state(b, "beta") == "inactive"
        # issue 29: the memory card, each device a bar with the running presets in it
        b.wait_js("return !!document.querySelector(\".lk-device[data-device='host'] "
                  ".lk-seg[data-preset='alpha']\")", what="alpha in the host's bar")
        head = str(b.driver.execute_script(
            "return document.querySelector(\".lk-device[data-device='host'] "
            ".lk-device-head\").textContent"))
        assert head.startswith("host") and ": lokid " in head and ", free " in head, head
        assert not b.driver.execute_script(
            "return !!document.querySelector(\".lk-seg[data-preset='beta']\")")


def test_a_member_starts_a_preset_from_the_page(cockpit_site, lokid):
    lokid.preset("gamma", MODEL)
    with Browser(cockpit_site.url) as b:
        b.login_to_page(cockpit_site.member.user, cockpit_site.member.password)
        b.wait_text("gamma")
        click_in_row(b, "gamma", "Start")
        assert active(lokid, "gamma", timeout=120) == "active"
        wait_state(b, "gamma", ("ready",), timeout=30)
        b.screenshot("overview-member-started")


def test_a_non_member_sees_the_presets_and_their_start_is_refused_in_words(cockpit_site, lokid):
    lokid.preset("delta", MODEL)
    with Browser(cockpit_site.url) as b:
        b.login_to_page(cockpit_site.outsider.user, cockpit_site.outsider.password)
        b.wait_text("delta")
        click_in_row(b, "delta", "Start")
        alert = b.find("#lk-alert")
        b.wait_js("return document.getElementById('lk-alert-title').textContent"
                  ".startsWith('Not permitted')", what="the refusal")
        b.screenshot("overview-outsider-refused")
        assert "StartPreset delta" in alert.text
        time.sleep(1)
        assert lokid.show("delta", "ActiveState")["ActiveState"] == "inactive"


def test_a_presets_view_shows_its_plan_journal_and_state(cockpit_site, lokid):
    lokid.preset("epsilon", MODEL)
    cockpit_site.ct.systemctl("start", unit("epsilon"), timeout=180)
    with Browser(cockpit_site.url) as b:
        b.login_to_page(cockpit_site.member.user, cockpit_site.member.password)
        b.open_preset("epsilon")
        argv = b.find("#lk-plan-argv").text
        assert "-m /var/lib/loki-models/llama.gguf" in argv and "--port" in argv, argv
        assert b.driver.find_elements("css selector", "#lk-plan-notes li")
        b.wait_js("return document.querySelector('#lk-preset-head .lk-state')"
                  ".textContent === 'ready'", what="the view's state")
        # The member is not in adm or systemd-journal: the daemon's ReadLogs (polkit,
        # group loki) gives the unit's journal, with the engine's own lines in it.
        b.wait_js("return document.getElementById('lk-journal').textContent"
                  ".includes('llama-server')", timeout=20, what="the engine's journal lines")
        assert "ReadLogs" in b.find("#lk-journal-source").text
        b.screenshot("preset-epsilon-member")
        # The shell's URL names the view: a link to it opens it again.
        assert "#/preset/epsilon" in b.driver.execute_script("return window.location.href")


def test_the_overview_of_fifty_presets_is_drawn_after_login(cockpit_site, lokid, capsys):
    """The issue's figure: the overview's first paint with 50 presets, from the click on
    *LLM engines* in the menu of the logged-in shell to the 50th row drawn with its state.
    Printed and kept in test-artifacts/ for the closing note; the machines are shared and
    noisy, so the test asserts the rows, not the time."""
    names = [f"p{i:02d}" for i in range(50)]
    for name in names:
        lokid.preset(name, MODEL, reload=False)
    lokid.reload()
    # The daemon plans the 50 after the reload: the figure is the page's, once it has.
    deadline = time.monotonic() + 120
    while True:
        r = cockpit_site.ct.run(["busctl", "--json=short", "get-property", "org.lokid.Lokid1",
                                 "/org/lokid/Lokid1", "org.lokid.Lokid1.Manager", "Presets"],
                                check=False)
        if r.returncode == 0 and len(json.loads(r.stdout)["data"]) == 50:
            break
        assert time.monotonic() < deadline, r.stdout + r.stderr
        time.sleep(0.5)
    with Browser(cockpit_site.url) as b:
        b.login(cockpit_site.member.user, cockpit_site.member.password)
        nav = b.find("#host-apps", timeout=60)
        link = next(a for a in nav.find_elements("css selector", "a")
                    if a.text.strip() == "LLM engines")
        # As an operator opens it: logged in, Cockpit's own Overview drawn first (its
        # start keeps the session's bridge busy: clicking at once measured 1.6-2.3 s, most
        # of it that), then LLM engines in the menu.
        b.find('iframe[name="cockpit1:localhost/system"]', timeout=60)
        time.sleep(3)
        asked_epoch_ms = time.time() * 1000
        link.click()
        b.driver.switch_to.frame(b.find('iframe[name="cockpit1:localhost/lokid"]'))
        b.wait_js("return document.querySelectorAll('#lk-presets tr[data-preset]').length "
                  ">= 50 && [...document.querySelectorAll('#lk-presets .lk-state')]"
                  ".every(s => s.textContent === 'inactive')", timeout=30,
                  what="50 rows, each with its state")
        shown = [r.get_attribute("data-preset") for r in
                 b.driver.find_elements("css selector", "#lk-presets tr[data-preset]")]
        assert shown == names
        # The page marks its first paint with every preset (performance.mark, in ms from
        # the frame's own start; the frame's start is in ms since the epoch).
        first, origin, objects = b.driver.execute_script(
            "const m = performance.getEntriesByName('lokid-overview')[0];"
            "const o = performance.getEntriesByName('lokid-presets')[0];"
            "return [m.startTime, performance.timeOrigin, o.startTime]")
        b.screenshot("overview-50-presets")
    frame = (origin - asked_epoch_ms) / 1000
    figure = (f"[cockpit {cockpit_site.ct.suite}] 50 presets: the overview's first paint "
              f"{frame + first / 1000:.2f} s after the click in Cockpit's menu (the shell "
              f"made the page's frame after {frame:.2f} s; in the frame, every preset's "
              f"properties came at {objects / 1000:.2f} s and the 50 rows were drawn at "
              f"{first / 1000:.2f} s)")
    with capsys.disabled():
        print("\n" + figure)
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    (ARTIFACTS / f"first-paint-{cockpit_site.ct.suite}.txt").write_text(figure + "\n")


def test_restart_and_clear_from_a_presets_view_and_a_non_members_clear_refused(
        cockpit_site, lokid):
    lokid.preset("zeta", MODEL)
    cockpit_site.ct.systemctl("start", unit("zeta"), timeout=180)
    first = lokid.show("zeta", "InvocationID")["InvocationID"]
    with Browser(cockpit_site.url) as b:
        b.login_to_page(cockpit_site.member.user, cockpit_site.member.password)
        b.open_preset("zeta")
        b.find("#lk-preset-restart").click()
        deadline = time.monotonic() + 120
        while lokid.show("zeta", "InvocationID")["InvocationID"] == first:
            assert time.monotonic() < deadline, "Restart on the page did not restart the unit"
            time.sleep(0.5)
        assert active(lokid, "zeta", timeout=120) == "active"
        b.wait_js("return document.querySelector('#lk-preset-head .lk-state')"
                  ".textContent === 'ready'", timeout=60, what="ready after the restart")
        b.find("#lk-failures-clear").click()
        b.wait_js("return document.getElementById('lk-failures-result').textContent"
                  ".includes('forgotten')", what="ClearFailures' count")
        assert b.find("#lk-failures-result").text == "0 failures forgotten."
        b.screenshot("preset-zeta-restarted")
    with Browser(cockpit_site.url) as b:
        b.login_to_page(cockpit_site.outsider.user, cockpit_site.outsider.password)
        b.open_preset("zeta")
        b.find("#lk-failures-clear").click()
        b.wait_js("return document.getElementById('lk-alert-title').textContent"
                  ".startsWith('Not permitted: ClearFailures zeta')", what="the refusal")
        b.screenshot("preset-zeta-outsider-clear-refused")


def test_a_user_the_journal_lets_read_gets_it_through_journalctl_live(cockpit_site, lokid):
    """A member who is also in systemd-journal reads the unit's journal with their own
    rights (journalctl as them, through the bridge), and follows it: a line the engine
    writes after the view opened appears without a reload."""
    port = lokid.preset("eta", MODEL)
    cockpit_site.ct.systemctl("start", unit("eta"), timeout=180)
    user = cockpit_site.member.user
    cockpit_site.ct.run(["usermod", "-aG", "systemd-journal", user])
    try:
        with Browser(cockpit_site.url) as b:
            b.login_to_page(user, cockpit_site.member.password)   # groups read at login
            b.open_preset("eta")
            b.wait_js("return document.getElementById('lk-journal-source').textContent"
                      ".startsWith('journalctl -u loki-engine@eta.service')",
                      what="the journal read through journalctl")
            b.wait_js("return document.getElementById('lk-journal').textContent"
                      ".includes('llama-server')", what="the engine's lines")
            # a request after the view opened: the engine logs it; the card follows
            assert "prompt eval time" not in b.find("#lk-journal").text
            lokid.chat(port, "Hi", max_tokens=2)
            b.wait_js("return document.getElementById('lk-journal').textContent"
                      ".includes('prompt eval time')", what="the request's timing line")
            b.screenshot("preset-eta-journalctl")
    finally:
        cockpit_site.ct.run(["gpasswd", "-d", user, "systemd-journal"], check=False)
