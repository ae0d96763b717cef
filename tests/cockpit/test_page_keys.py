"""The overview's keys and usage cards (issue 46, items 1 and 2) in a real browser, logged
into the real Cockpit, over the real lokid.service, polkitd and dbus-daemon of the
container (tests/cockpit/conftest.py).

What an operator does there: reads each key's counts today and this month, as the
gateway reported them to the daemon (GatewayUsage, called here as root, as the gateway's
own user would); adds a key from a form and sees it once, in a dialog, while the keys
file holds only its hash; rotates it (a new key, shown once) and revokes it; sees a key
added from a shell appear without a reload (KeysChanged). A user outside group loki is
refused the list by polkit, and the card says so naming the action. Screenshots are kept
in test-artifacts/ (tests/support/cockpitkit.py).
"""

from __future__ import annotations

import hashlib
import json
from datetime import UTC, datetime

import pytest
from support.cockpitkit import Browser
from support.lokid_install import unit
from support.systemd_harness import Container

pytestmark = [pytest.mark.systemd, pytest.mark.engine, pytest.mark.slow]

KEYS = "/etc/loki/clients/keys.toml"
ACTION = "org.lokid.lokid1.manage-keys"


def digest(secret: str) -> str:
    return "sha256:" + hashlib.sha256(secret.encode()).hexdigest()


def cell(b: Browser, table: str, key: str, n: int) -> str:
    """The text of the ``n``-th cell (0: the key's name) of ``key``'s row in ``table``."""
    return str(b.driver.execute_script(
        "const r = document.querySelector(`#${arguments[0]} tr[data-key='${arguments[1]}']`);"
        "return r ? r.children[arguments[2]].textContent : null;", table, key, n))


def shown_anywhere(b: Browser, text: str) -> bool:
    """Whether ``text`` is in what the page shows or in any of its fields' values."""
    return bool(b.driver.execute_script(
        "return document.body.innerText.includes(arguments[0]) || [...document"
        ".querySelectorAll('input, textarea')].some(i => i.value.includes(arguments[0]))",
        text))


def once_dialog(b: Browser) -> str:
    """The key the dialog shows, once it is open, with its warning."""
    b.wait_js("return document.getElementById('lk-key-once').open", what="the key's dialog")
    assert "not shown again" in b.find("#lk-key-once").text
    secret = str(b.find("#lk-key-once-value").get_attribute("value"))
    assert secret.startswith("sk-loki-"), secret
    return secret


def close_dialog(b: Browser, secret: str) -> None:
    b.find("#lk-key-once-close").click()
    b.wait_js("return !document.getElementById('lk-key-once').open", what="dialog closed")
    assert not shown_anywhere(b, secret), "the key is still in the page after its dialog"


def confirm(b: Browser, key: str, verb: str) -> None:
    b.find(f"#lk-keys-rows tr[data-key='{key}'] button[data-verb='{verb}']").click()
    assert key in b.find("#lk-keys-confirm-text").text
    b.find("#lk-keys-confirm-yes").click()


def report(ct: Container, key: str, requests: int, prompt: int, generated: int,
           refused: int) -> None:
    """What the gateway sends once a second (GatewayUsage), as root: ``key``'s counts on
    preset alpha today, the engines' own token figures."""
    day = datetime.now(UTC).date().isoformat()
    ct.run(["busctl", "call", "org.lokid.Lokid1", "/org/lokid/Lokid1",
            "org.lokid.Lokid1.Usage", "GatewayUsage", "a(sssa{st})", "1",
            day, key, "alpha", "4", "requests", str(requests), "prompt_tokens", str(prompt),
            "generated_tokens", str(generated), "refused_429", str(refused)])


def test_the_usage_card_shows_a_keys_counts_as_the_gateway_reported_them(cockpit_site, lokid):
    ct = cockpit_site.ct
    # 3 requests, one of them refused 429, 120 prompt and 45 generated tokens
    report(ct, "carol-cockpit", 3, 120, 45, 1)
    r = ct.run(["busctl", "--json=short", "call", "org.lokid.Lokid1", "/org/lokid/Lokid1",
                "org.lokid.Lokid1.Usage", "Usage", "a{sv}", "1", "key", "s", "carol-cockpit"])
    (row,) = json.loads(r.stdout)["data"][0]
    assert row["requests"]["data"] == 3, row   # the daemon kept it: what the page must show
    lokid.preset("alpha", 'model = "llama.gguf"\n')
    with Browser(cockpit_site.url) as b:
        b.login_to_page(cockpit_site.member.user, cockpit_site.member.password)
        b.wait_js("return !!document.querySelector(\"#lk-usage-rows tr[data-key='carol-cockpit']\")"
                  " && !document.getElementById('lk-usage').hidden", what="carol's usage row")
        today = [cell(b, "lk-usage-rows", "carol-cockpit", n) for n in (1, 2, 3)]
        month = [cell(b, "lk-usage-rows", "carol-cockpit", n) for n in (4, 5, 6)]
        assert today == ["3", "165", "1"], today
        assert month == ["3", "165", "1"], month
        b.screenshot("overview-usage-card")
        # hidden on a preset's view
        b.open_preset("alpha")
        assert b.driver.execute_script("return document.getElementById('lk-usage').hidden")
        assert b.driver.execute_script("return document.getElementById('lk-keys').hidden")

        # Back on the overview, the card follows while the presets' figures move (Usage
        # has no signal; the page asks at most twice a minute then, never on a timer).
        b.driver.execute_script("cockpit.location.go([])")
        b.wait_js("return !document.getElementById('lk-usage').hidden", what="usage again")
        report(ct, "carol-cockpit", 2, 10, 5, 0)
        lokid.track_unit(unit("alpha"))
        ct.systemctl("start", "--no-block", unit("alpha"))
        b.wait_js("const r = document.querySelector(\"#lk-usage-rows tr[data-key="
                  "'carol-cockpit']\"); return r && r.children[1].textContent === '5'",
                  timeout=180, what="carol's 5 requests")
        assert cell(b, "lk-usage-rows", "carol-cockpit", 2) == "180"


def test_a_member_adds_a_key_sees_it_once_rotates_and_revokes_it(cockpit_site, lokid):
    ct = cockpit_site.ct
    lokid.track_path(KEYS)
    with Browser(cockpit_site.url) as b:
        b.login_to_page(cockpit_site.member.user, cockpit_site.member.password)
        b.wait_js("return document.getElementById('lk-keys-message').textContent"
                  " === 'No named keys yet.'", what="the empty keys card")
        b.find("#lk-keys-add summary").click()
        b.find("#lk-key-name").send_keys("ci-bot")
        b.find("#lk-key-class option[value='batch']").click()
        b.find("#lk-key-models").send_keys("llama*, qwen")
        b.find("#lk-key-requests_per_minute").send_keys("60")
        b.find("#lk-key-add").click()
        secret = once_dialog(b)
        b.find("#lk-key-once-copy").click()
        copied = b.wait_js("return document.getElementById('lk-key-once-copied').textContent",
                           what="the copy's outcome")
        assert str(copied).startswith("Copied"), copied
        b.screenshot("keys-added-once")
        # the file holds the key's hash and prefix, never the key
        text = ct.read_file(KEYS)
        assert secret not in text and digest(secret) in text, text
        close_dialog(b, secret)

        b.wait_js("return !!document.querySelector(\"#lk-keys-rows tr[data-key='ci-bot']\")",
                  what="ci-bot's row")
        row = [cell(b, "lk-keys-rows", "ci-bot", n) for n in range(7)]
        assert row == ["ci-bot", secret[:12] + "…", "batch", "llama*, qwen",
                       "60 requests/min", "never", "active"], row

        # the daemon's refusal, in its words, in the card
        b.find("#lk-key-name").send_keys("ci-bot")
        b.find("#lk-key-add").click()
        b.wait_js("return !document.getElementById('lk-keys-error').hidden",
                  what="AddKey's refusal")
        error = b.find("#lk-keys-error").text
        assert error.startswith("AddKey ci-bot failed.") and "exists already" in error, error
        assert not b.driver.execute_script("return document.getElementById('lk-key-once').open")

        confirm(b, "ci-bot", "RotateKey")
        rotated = once_dialog(b)
        assert rotated != secret
        text = ct.read_file(KEYS)
        assert rotated not in text and digest(rotated) in text, text
        close_dialog(b, rotated)
        b.wait_js("return document.querySelector(\"#lk-keys-rows tr[data-key='ci-bot'] "
                  ".lk-key-prefix\").textContent === arguments[0]", rotated[:12] + "…",
                  what="the rotated key's prefix")

        confirm(b, "ci-bot", "RevokeKey")
        b.wait_js("return document.querySelector(\"#lk-keys-rows tr[data-key='ci-bot'] "
                  ".lk-key-state\").textContent === 'revoked'", what="ci-bot revoked")
        assert "revoked = " in ct.read_file(KEYS)
        assert not b.driver.find_elements(
            "css selector", "#lk-keys-rows tr[data-key='ci-bot'] button")
        b.screenshot("keys-revoked")

        # a key added from a shell: KeysChanged, the row without a reload
        r = ct.run(["lokictl", "keys", "add", "from-shell"], check=False, timeout=60)
        assert r.returncode == 0, (r.stdout, r.stderr)
        b.wait_js("return !!document.querySelector(\"#lk-keys-rows tr[data-key='from-shell']\")",
                  what="the shell's key")
        assert not shown_anywhere(b, r.stdout.strip())


def test_a_user_outside_group_loki_is_refused_the_keys_naming_the_action(cockpit_site, lokid):
    with Browser(cockpit_site.url) as b:
        b.login_to_page(cockpit_site.outsider.user, cockpit_site.outsider.password)
        b.wait_js("return document.getElementById('lk-keys-message').textContent"
                  ".startsWith('Not permitted')", what="the refusal")
        message = b.find("#lk-keys-message").text
        assert ACTION in message and "ListKeys" in message, message
        # nothing to act on: no list, no form
        assert b.driver.execute_script("return document.getElementById('lk-keys-list').hidden")
        assert not b.driver.find_element("css selector", "#lk-key-add").is_displayed()
        b.screenshot("keys-outsider-refused")
