"""A preset's view for the presets that are no engine to start, in a real browser over the
real lokid.service of the container (tests/cockpit/conftest.py; issue 28, item 17).

An external preset (kind = "external": an OpenAI-compatible API elsewhere) says what it
is, its url and upstream model, with no Start, Stop or Restart, no engine keys in the
Edit card's form and no benchmark; a broken preset (the daemon's BrokenPresets: a file
that cannot be read, which has no object, or a valid one that cannot start as it is,
which keeps one) says "broken" and why, with no Start, on its view and on the overview.
Before, the page showed both as "inactive" engines: Start and a Benchmark form on each.
"""

from __future__ import annotations

from typing import Any

import pytest
from support.cockpitkit import Browser
from support.lokid_install import LokidSystem

pytestmark = [pytest.mark.systemd, pytest.mark.engine, pytest.mark.slow]

# cockpit_site is tests/cockpit/conftest.py's CockpitSite, a type no test module may import
# by name (tests/test_layout.py): Any here.


def shown(b: Browser, css: str) -> bool:
    """Whether an element ``css`` is there and drawn (not hidden, nor inside a hidden
    card)."""
    return any(e.is_displayed() for e in b.driver.find_elements("css selector", css))


def head_state(b: Browser) -> str:
    return str(b.driver.execute_script(
        "return document.querySelector('#lk-preset-head .lk-state').textContent"))


def wait_head_state(b: Browser, state: str) -> None:
    b.wait_js("const s = document.querySelector('#lk-preset-head .lk-state');"
              "return s && s.textContent === arguments[0]", state,
              what=f"the view's state {state}")


def no_verbs(b: Browser) -> None:
    for verb in ("start", "stop", "restart"):
        assert not shown(b, f"#lk-preset-{verb}"), f"{verb} shown"


def test_an_external_presets_view_says_what_it_is_without_engine_verbs_keys_or_bench(
        cockpit_site: Any, lokid: LokidSystem) -> None:
    lokid.write_preset_text("remote", 'kind = "external"\n'
                            'url = "http://127.0.0.1:9/v1"\n'
                            'upstream_model = "qwen3-32b"\n')
    with Browser(cockpit_site.url) as b:
        b.login_to_page(cockpit_site.member.user, cockpit_site.member.password)
        b.open_preset("remote")
        wait_head_state(b, "external")
        no_verbs(b)
        b.wait_js("return document.getElementById('lk-external').textContent"
                  ".includes('qwen3-32b')", what="the external API's facts")
        facts = b.find("#lk-external").text
        assert "http://127.0.0.1:9/v1" in facts and "qwen3-32b" in facts, facts
        assert "nothing runs here" in b.find("#lk-preset-head").text
        # nothing of an engine: no plan, charts, failures, journal or benchmark
        for section in ("plan", "charts", "failures", "journal", "bench"):
            assert not shown(b, f"#lk-section-{section}"), section
        # the Edit card's form: the external preset's keys, none of an engine's
        b.wait_js("return document.getElementById('lk-edit-key-url').value"
                  " === 'http://127.0.0.1:9/v1'", what="the form's url")
        assert shown(b, "#lk-edit-key-upstream-model")
        for key in ("model", "ctx", "gpus", "port", "spec-mode", "chat-temperature"):
            assert not shown(b, f"#lk-edit-key-{key}"), key
        b.screenshot("preset-external")


def test_a_broken_preset_says_broken_and_why_without_start(cockpit_site: Any,
                                                           lokid: LokidSystem) -> None:
    # One that cannot be read (no object), one that cannot start as it is (its model is
    # missing: it keeps its object, whose State is inactive).
    lokid.write_preset_text("unread", "ctx = [not toml\n")
    lokid.preset("nomodel", 'model = "missing.gguf"\n')
    with Browser(cockpit_site.url) as b:
        b.login_to_page(cockpit_site.member.user, cockpit_site.member.password)
        b.wait_text("nomodel")
        # the overview: broken, the reason under the row, no Start
        b.wait_js("const r = document.querySelector(\"tr[data-preset='nomodel'] .lk-state\");"
                  "return r && r.textContent === 'broken'", what="nomodel broken on the overview")
        for name in ("unread", "nomodel"):
            assert not shown(b, f"tr[data-preset='{name}'] .lk-cell-actions button"), name

        b.open_preset("nomodel")
        wait_head_state(b, "broken")
        assert "missing.gguf" in b.find("#lk-preset-head").text
        no_verbs(b)
        for section in ("bench", "chat", "charts", "failures"):
            assert not shown(b, f"#lk-section-{section}"), section
        assert shown(b, "#lk-section-editor")     # where it is fixed
        b.screenshot("preset-broken-model")

        b.find("#lk-preset-head a.lk-back").click()
        b.open_preset("unread")
        wait_head_state(b, "broken")
        assert "unread.toml" in b.find("#lk-preset-head").text
        no_verbs(b)
        assert not shown(b, "#lk-section-bench")
        b.screenshot("preset-broken-file")
