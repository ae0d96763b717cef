"""A preset's Replicas card (issue 47) in a real browser, logged into the real Cockpit,
over the real lokid.service, systemd and engines of the container
(tests/cockpit/conftest.py): a preset with ``replicas = 2`` started runs two units, and
its view lists each engine (its index, unit, state, port: the preset's + k - 1, requests
in flight) with the bound ``max_replicas``; a replica stopped by hand is followed without
a reload (the ``Replicas`` property's PropertiesChanged). On Debian 13's Cockpit only:
the card is plain DOM, which the overview's tests already try on both."""

from __future__ import annotations

import pytest
from support.cockpitkit import Browser

pytestmark = [pytest.mark.systemd, pytest.mark.engine, pytest.mark.slow]


def rows(b: Browser) -> list[list[str]]:
    return list(b.driver.execute_script(
        "return [...document.querySelectorAll('#lk-replicas tbody tr')]"
        ".map(r => [...r.children].map(c => c.textContent));"))


@pytest.mark.parametrize("cockpit_site", ["trixie"], indirect=True)
def test_the_replicas_card_lists_each_engine_and_follows_a_stop(cockpit_site, lokid):
    ct = cockpit_site.ct
    port = lokid.preset("rep", 'model = "llama.gguf"\nextra_args = ["-np", "1"]\n'
                        "[serve]\nreplicas = 2\nmax_replicas = 3\n")
    lokid.track_unit("loki-engine@rep:2.service")
    ct.run(["lokictl", "start", "--wait", "rep"], timeout=180)
    with Browser(cockpit_site.url) as b:
        b.login_to_page(cockpit_site.member.user, cockpit_site.member.password)
        b.open_preset("rep")
        b.wait_js("const r = [...document.querySelectorAll('#lk-replicas tbody tr')];"
                  " return r.length === 2 && r.every(x => x.children[2].textContent"
                  " === 'ready') && !document.getElementById('lk-replicas').hidden",
                  what="both engines ready in the Replicas card", timeout=120)
        assert rows(b) == [["1", "loki-engine@rep.service", "ready", str(port), "0"],
                           ["2", "loki-engine@rep:2.service", "ready", str(port + 1), "0"]]
        text = b.driver.execute_script(
            "return document.getElementById('lk-replicas').previousElementSibling"
            ".textContent")
        assert text.startswith("Up to 3 engines ([serve] max_replicas)"), text
        b.screenshot("preset-replicas-card")
        # replica 2 stopped by hand: its row follows, replica 1 serves on
        ct.run(["lokictl", "replica", "stop", "rep", "2"], timeout=60)
        b.wait_js("const r = document.querySelector(\"#lk-replicas tr[data-index='2']\");"
                  " return r && r.children[2].textContent === 'inactive'",
                  what="replica 2's row inactive", timeout=60)
        assert rows(b)[0][2] == "ready"
