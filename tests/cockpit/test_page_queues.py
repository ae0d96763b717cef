"""The overview's waiting requests card (issue 46, item 4) in a real browser, logged into
the real Cockpit, over the real lokid.service and dbus-daemon of the container
(tests/cockpit/conftest.py): what the gateway reports of who waits (ReportQueues, called
here as root, as the gateway's own user would) is shown per preset, key and class with
its why and the oldest wait, followed without a reload, and the card hides once nothing
waits (the Queues property's PropertiesChanged)."""

from __future__ import annotations

import json
import time

import pytest
from support.cockpitkit import Browser
from support.systemd_harness import Container

pytestmark = [pytest.mark.systemd, pytest.mark.engine, pytest.mark.slow]

ROWS = "#lk-queues-rows"


def report(ct: Container, *rows: tuple[str, str, bool, int, float, str]) -> None:
    """What the gateway sends when who waits changes (ReportQueues), as root."""
    args = [str(len(rows))]
    for preset, key, batch, n, oldest, why in rows:
        args += [preset, key, "true" if batch else "false", str(n), str(oldest), why]
    ct.run(["busctl", "call", "org.lokid.Lokid1", "/org/lokid/Lokid1",
            "org.lokid.Lokid1.Usage", "ReportQueues", "a(ssbuds)", *args])


def cells(b: Browser, key: str) -> list[str]:
    return list(b.driver.execute_script(
        "const r = document.querySelector(`#lk-queues-rows tr[data-key='${arguments[0]}']`);"
        "return r ? [...r.children].map(c => c.textContent) : [];", key))


def wait_known(ct: Container, name: str, timeout: float = 20.0) -> None:
    """Until the daemon lists preset ``name``: it notices a new file on its own schedule,
    and ReportQueues drops the rows of a preset it does not know (a CI run reported
    before the daemon had seen alpha, and both rows were dropped)."""
    path = f"/org/lokid/Lokid1/preset/{name}"
    deadline = time.monotonic() + timeout
    while True:
        r = ct.run(["busctl", "--json=short", "get-property", "org.lokid.Lokid1",
                    "/org/lokid/Lokid1", "org.lokid.Lokid1.Manager", "Presets"])
        if r.returncode == 0 and path in json.loads(r.stdout)["data"]:
            return
        assert time.monotonic() < deadline, f"the daemon never listed {name}: {r.stdout}"
        time.sleep(0.2)


def test_the_waiting_card_shows_who_waits_and_hides_once_none_does(cockpit_site, lokid):
    ct = cockpit_site.ct
    lokid.preset("alpha", 'model = "llama.gguf"\n')
    wait_known(ct, "alpha")
    report(ct, ("alpha", "bob", False, 2, 3.5, "slots busy (1/1)"),
           ("alpha", "job", True, 1, 1.0, "slots busy (1/1)"),
           ("nosuch", "eve", False, 1, 1.0, "loading"))
    r = ct.run(["busctl", "--json=short", "get-property", "org.lokid.Lokid1",
                "/org/lokid/Lokid1", "org.lokid.Lokid1.Usage", "Queues"])
    kept = json.loads(r.stdout)["data"]
    assert sorted(row["key"]["data"] for row in kept) == ["bob", "job"], kept   # no nosuch
    with Browser(cockpit_site.url) as b:
        b.login_to_page(cockpit_site.member.user, cockpit_site.member.password)
        b.wait_js("return !!document.querySelector(\"#lk-queues-rows tr[data-key='bob']\")"
                  " && !document.getElementById('lk-queues').hidden", what="bob's waiting row")
        bob = cells(b, "bob")
        assert bob[:4] == ["alpha", "bob", "interactive", "2"] and bob[5] == \
            "slots busy (1/1)", bob
        assert int(bob[4].removesuffix(" s")) >= 3, bob   # the daemon's age, grown here
        assert cells(b, "job")[2:4] == ["batch", "1"]
        b.screenshot("overview-waiting-card")
        # a change followed without a reload (PropertiesChanged)
        report(ct, ("alpha", "bob", False, 1, 0.5, "loading"))
        b.wait_js("const r = document.querySelector(\"#lk-queues-rows tr[data-key='bob']\");"
                  " return r && r.children[5].textContent === 'loading'"
                  " && !document.querySelector(\"#lk-queues-rows tr[data-key='job']\")",
                  what="bob's row changed, job's gone")
        # hidden on a preset's view
        b.open_preset("alpha")
        assert b.driver.execute_script("return document.getElementById('lk-queues').hidden")
        b.driver.execute_script("cockpit.location.go([])")
        b.wait_js("return !document.getElementById('lk-queues').hidden", what="shown again")
        report(ct)   # nothing waits any more
        b.wait_js("return document.getElementById('lk-queues').hidden", what="card hidden")
