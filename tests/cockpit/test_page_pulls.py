"""The overview's model pulls card (issue 48) in a real browser, logged into the real
Cockpit, over the real lokid.service, polkitd and dbus-daemon of the container
(tests/cockpit/conftest.py), each pull a real ``loki-pull-*.service`` fetching from the
hub's stand-in (:mod:`support.hubstand`), which runs in the container as a transient unit
of its own, with lokid.service given ``HF_ENDPOINT`` by a drop-in, as an operator sets a
mirror.

What an operator does there: starts a pull from the card's form and sees its row's
progress rise without a reload (PullProgress) and reach done with the model's file name;
cancels a slow one and sees it stopped with the daemon's reason; types a reference the
daemon cannot read and sees the daemon's own words (InvalidArgs) under the form, and no
pull; outside group loki, sees polkit's refusal naming the action. Screenshots are kept
in test-artifacts/ (tests/support/cockpitkit.py).
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from support.cockpitkit import Browser
from support.enginekit import free_port
from support.hubstand import set_faults, start_in_container
from support.lokid_install import LokidSystem
from support.systemd_harness import Container

pytestmark = [pytest.mark.systemd, pytest.mark.engine, pytest.mark.slow]

HUB_SCRIPT = "/opt/lokid/tests/support/hubstand.py"   # the repository, bound read-only
HUB_ROOT = "/srv/hub-cockpit"
HUB_UNIT = "loki-hubstand-cockpit.service"
DROPIN = "/etc/systemd/system/lokid.service.d/90-hf-test.conf"
DAEMON = "lokid.service"
REFERENCE = "org/tiny:Q4_K_M"
MODEL = "x-Q4_K_M.gguf"
SIZE = 6 << 20
ACTION = "org.lokid.lokid1.manage"

# Every change of a pull row's state or bytes, as the page made it (the test looks at
# what the page drew, not at the bus): [unit, state, done].
RECORD = """
window.lkSeen = [];
new MutationObserver(changes => {
    for (const m of changes) {
        const tr = m.target;
        if (tr.dataset && tr.dataset.unit)
            window.lkSeen.push([tr.dataset.unit, tr.dataset.state, Number(tr.dataset.done)]);
    }
}).observe(document.getElementById('lk-pulls-rows'),
           {subtree: true, attributes: true, attributeFilter: ['data-state', 'data-done']});
"""

# The cells of the row whose directory is arguments[0], with its unit; null when none.
ROW = """
const tr = [...document.querySelectorAll('#lk-pulls-rows tr')]
    .find(r => r.children[1].textContent === arguments[0]);
return tr ? {unit: tr.dataset.unit, state: tr.dataset.state, done: Number(tr.dataset.done),
             total: Number(tr.dataset.total), cells: [...tr.children].map(c => c.textContent),
             cancel: !tr.querySelector("button[data-verb='CancelPull']").hidden} : null;
"""


@dataclass(frozen=True)
class Hub:
    base: str       # the stand-in's URL, from the host and the container alike
    sha: str        # the model's SHA-256


def restart_daemon(ct: Container) -> None:
    ct.systemctl("daemon-reload")
    ct.systemctl("restart", DAEMON, timeout=120)
    ct.wait_for(DAEMON, "active", timeout=60)


@pytest.fixture(scope="module")
def hub(cockpit_site: Any, lokid_site: LokidSystem) -> Iterator[Hub]:
    """The stand-in serving ``org/tiny`` (one model of 6 MiB) in the container, and the
    daemon restarted with ``HF_ENDPOINT`` naming it; both undone after the module."""
    ct = cockpit_site.ct
    model = b"GGUF" + os.urandom(SIZE - 4)
    ct.write_file(f"{HUB_ROOT}/org/tiny/{MODEL}", model)
    port = free_port()
    try:
        base = start_in_container(ct, HUB_SCRIPT, HUB_ROOT, port, HUB_UNIT)
        ct.write_file(DROPIN, f"[Service]\nEnvironment=HF_ENDPOINT={base}\n")
        restart_daemon(ct)
        yield Hub(base, hashlib.sha256(model).hexdigest())
    finally:
        ct.systemctl("stop", HUB_UNIT, check=False)
        ct.run(["rm", "-rf", "--", DROPIN, HUB_ROOT], check=False)
        restart_daemon(ct)


def target(ct: Container, lokid: LokidSystem, name: str) -> str:
    """A fresh directory owned by loki (the pull's unit runs as loki and may write only
    there), removed after the test."""
    path = f"/var/lib/loki/pulls-{name}"
    ct.run(["rm", "-rf", "--", path])
    ct.run(["install", "-d", "-o", "loki", "-g", "loki", "-m", "0750", path])
    lokid.track_path(path)
    return path


def listed(ct: Container) -> list[dict[str, Any]]:
    """ListPulls as the daemon answers it, as plain values."""
    r = ct.run(["busctl", "--json=short", "call", "org.lokid.Lokid1", "/org/lokid/Lokid1",
                "org.lokid.Lokid1.Pulls", "ListPulls"])
    return [{k: v["data"] for k, v in p.items()} for p in json.loads(r.stdout)["data"][0]]


def row(b: Browser, directory: str) -> dict[str, Any] | None:
    got: dict[str, Any] | None = b.driver.execute_script(ROW, directory)
    return got


def settled(b: Browser, ct: Container, directory: str, test: str, what: str,
            timeout: float = 60) -> dict[str, Any]:
    """The row of ``directory`` once ``test`` (JS over its row ``r``) holds; on a timeout,
    the failure with what the pull units logged."""
    try:
        got = b.wait_js(f"const r = (() => {{{ROW}}})(); return r && ({test}) && r",
                        directory, timeout=timeout, what=what)
    except AssertionError as e:
        units = ct.run(["journalctl", "--unit", "loki-pull-*", "--output=cat", "--no-pager",
                        "--quiet"], check=False).stdout
        raise AssertionError(f"{e}\n--- the pull units' journal\n{units[-4000:]}") from None
    assert isinstance(got, dict)
    return got


def open_card(b: Browser, who: Any) -> None:
    b.login_to_page(who.user, who.password)
    b.wait_js("return !document.getElementById('lk-pulls').hidden", what="the pulls card")


def pull(b: Browser, reference: str, directory: str) -> None:
    b.find("#lk-pull-reference").clear()
    b.find("#lk-pull-reference").send_keys(reference)
    b.find("#lk-pull-directory").clear()
    b.find("#lk-pull-directory").send_keys(directory)
    b.find("#lk-pull-start").click()


def test_a_pull_from_the_form_rises_live_to_done_with_its_model(
        cockpit_site: Any, lokid: LokidSystem, hub: Hub) -> None:
    ct = cockpit_site.ct
    d = target(ct, lokid, "done")
    set_faults(hub.base, slow=60)          # 64 KiB per 60 ms: about 6 s for 6 MiB
    try:
        with Browser(cockpit_site.url) as b:
            open_card(b, cockpit_site.member)
            b.driver.execute_script(RECORD)
            pull(b, REFERENCE, d)
            got = settled(b, ct, d, "r.state === 'done' && r.cells[4]",
                          "the pull's row done, with its model", 120)
            lokid.track_unit(got["unit"])
            seen = [(s, n) for u, s, n in b.driver.execute_script("return window.lkSeen")
                    if u == got["unit"]]
            b.screenshot("pulls-done")
    finally:
        set_faults(hub.base)
    # live: the bytes rose in the page, in steps, before done (signals, not one reload)
    rising = [n for s, n in seen if s == "fetching" and 0 < n < SIZE]
    assert len(set(rising)) >= 2, seen
    assert rising == sorted(rising), seen
    assert seen[-1] == ("done", SIZE), seen
    reference, directory, state, progress, model, _ = got["cells"]
    assert (reference, directory, state) == (REFERENCE, d, "done"), got
    assert progress.strip() == "100 % · 6.0 MiB of 6.0 MiB", got
    assert got["total"] == SIZE and not got["cancel"], got
    # the model's file name, as the daemon gives it, and the file whole where it says
    daemon = next(p for p in listed(ct) if p["unit"] == got["unit"])
    assert daemon["model"] == MODEL and model == MODEL, (daemon, got)
    out = ct.run(["sha256sum", f"{d}/{MODEL}"]).stdout
    assert out.split()[0] == hub.sha, out


def test_a_cancel_of_a_slow_pull_shows_it_stopped_with_the_daemons_reason(
        cockpit_site: Any, lokid: LokidSystem, hub: Hub) -> None:
    ct = cockpit_site.ct
    d = target(ct, lokid, "cancel")
    set_faults(hub.base, slow=300)         # about 30 s for 6 MiB: time to cancel
    try:
        with Browser(cockpit_site.url) as b:
            open_card(b, cockpit_site.member)
            pull(b, REFERENCE, d)
            got = settled(b, ct, d, "r.state === 'fetching' && r.done > 0",
                          "the slow pull fetching")
            assert got["cancel"], got
            lokid.track_unit(got["unit"])
            b.find(f"#lk-pulls-rows tr[data-unit='{got['unit']}'] "
                   "button[data-verb='CancelPull']").click()
            stopped = settled(b, ct, d, "r.state === 'stopped'", "the pull stopped")
            b.screenshot("pulls-stopped")
            assert b.driver.execute_script(
                "return document.getElementById('lk-pulls-error').hidden"), \
                b.find("#lk-pulls-error").text
    finally:
        set_faults(hub.base)
    daemon = next(p for p in listed(ct) if p["unit"] == got["unit"])
    assert daemon["state"] == "stopped" and daemon["detail"], daemon
    assert stopped["cells"][4] == daemon["detail"], (stopped, daemon)   # its reason
    assert 0 < stopped["done"] < SIZE and not stopped["cancel"], stopped
    assert f"{MODEL}.part" in ct.run(["ls", d]).stdout     # kept for a resume


def test_a_bad_reference_shows_the_daemons_words_and_starts_nothing(
        cockpit_site: Any, lokid: LokidSystem, hub: Hub) -> None:
    ct = cockpit_site.ct
    d = target(ct, lokid, "bad")
    before = listed(ct)
    with Browser(cockpit_site.url) as b:
        open_card(b, cockpit_site.member)
        pull(b, "no-slash", d)
        b.wait_js("return !document.getElementById('lk-pulls-error').hidden",
                  what="Pull's refusal")
        error = b.find("#lk-pulls-error").text
        b.screenshot("pulls-bad-reference")
        # the operator's text stays, to be corrected
        assert b.find("#lk-pull-reference").get_attribute("value") == "no-slash"
        assert row(b, d) is None
    assert error.startswith("Pull no-slash failed.") and \
        "cannot read the model reference 'no-slash'" in error, error
    assert listed(ct) == before


def test_a_user_outside_group_loki_sees_the_list_and_is_refused_a_pull(
        cockpit_site: Any, lokid: LokidSystem, hub: Hub) -> None:
    ct = cockpit_site.ct
    d = target(ct, lokid, "outsider")
    with Browser(cockpit_site.url) as b:
        open_card(b, cockpit_site.outsider)
        pull(b, REFERENCE, d)
        b.wait_js("return !document.getElementById('lk-pulls-error').hidden",
                  what="polkit's refusal")
        error = b.find("#lk-pulls-error").text
        assert row(b, d) is None
    assert error.startswith(f"Pull {REFERENCE} failed. Not permitted") and ACTION in error, \
        error
    assert not [p for p in listed(ct) if p["directory"] == d]
