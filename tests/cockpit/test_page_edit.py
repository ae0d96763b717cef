"""Editing presets from the page (cockpit/lokid/editor.js) in a real browser, logged into
the real Cockpit of the container, over the real lokid.service and its editing methods
(GetPresetSource, UpdatePreset, SetPresetKeys, CreatePreset, RenamePreset, DeletePreset,
DraftCandidates), with polkit deciding who may.

What an operator does there: an invalid value is refused with the daemon's error shown
at its line, the file untouched; a change through the form of common keys is that one
line of the file; a file changed from a shell while the page had it open is never
overwritten ("changed elsewhere", Reload shows the shell's text); a user outside group
loki is refused in polkit's words; a preset is created, renamed and deleted from the
page, and deleting a running one is refused until forced, as the daemon says. The files
are compared in the container, byte for byte. Screenshots go to test-artifacts/.
"""

from __future__ import annotations

import base64
import difflib
import time
from typing import Any

import pytest
from support.cockpitkit import Browser
from support.lokid_install import LokidSystem, unit
from support.modelset import Models

pytestmark = [pytest.mark.systemd, pytest.mark.engine, pytest.mark.slow]

MODEL = 'model = "llama.gguf"\n'
PRESETS = "/etc/loki/presets"


def file_bytes(site: Any, name: str) -> bytes:
    """The preset file as it is in the container, its bytes exactly (base64: the
    container's commands answer in text)."""
    out = site.ct.run(["base64", "-w0", f"{PRESETS}/{name}.toml"]).stdout
    return base64.b64decode(out)


def exists(site: Any, name: str) -> bool:
    return bool(site.ct.run(["test", "-e", f"{PRESETS}/{name}.toml"], check=False).returncode == 0)


def set_value(b: Browser, css: str, value: str) -> None:
    """Type ``value`` into the field ``css`` as a person would end up with it."""
    b.find(css)
    b.driver.execute_script(
        "const e = document.querySelector(arguments[0]); e.value = arguments[1];"
        "e.dispatchEvent(new Event('input', {bubbles: true}));"
        "e.dispatchEvent(new Event('change', {bubbles: true}));", css, value)


def text_of(b: Browser, css: str) -> str:
    return str(b.driver.execute_script(
        "const e = document.querySelector(arguments[0]); return e ? e.textContent : ''", css))


def open_editor(b: Browser, name: str, *, readable: bool = True) -> None:
    """From the overview to ``name``'s view, its Edit card loaded (the file's text in the
    editor when ``readable``; else the daemon's refusal said)."""
    b.open_preset(name)
    b.find("#lk-section-editor #lk-edit-source")
    if readable:
        b.wait_js("return document.getElementById('lk-edit-source').value.includes('model')",
                  what="the file's text in the editor")
    else:
        b.wait_js("return !document.getElementById('lk-edit-status').hidden",
                  what="the editor's answer")


def test_an_invalid_value_is_shown_at_its_line_and_the_file_is_unchanged(
        cockpit_site: Any, lokid: LokidSystem) -> None:
    lokid.preset("ed-invalid", MODEL)
    before = file_bytes(cockpit_site, "ed-invalid")
    assert before.splitlines()[1] == b"ctx = 2048"
    with Browser(cockpit_site.url) as b:
        b.login_to_page(cockpit_site.member.user, cockpit_site.member.password)
        open_editor(b, "ed-invalid")
        shown = str(b.driver.execute_script(
            "return document.getElementById('lk-edit-source').value"))
        assert shown.encode() == before

        # a value of the wrong type on line 2: the daemon's planner refuses it
        set_value(b, "#lk-edit-source", shown.replace("ctx = 2048", 'ctx = "lots"'))
        b.find("#lk-edit-save").click()
        b.wait_js("return document.getElementById('lk-edit-status').textContent"
                  ".includes('line 2:')", what="the error at line 2")
        status = text_of(b, "#lk-edit-status")
        assert "ctx" in status and "not saved" in status, status
        assert text_of(b, "#lk-edit-bad-line") == "2"
        b.screenshot("edit-invalid-value")
        assert file_bytes(cockpit_site, "ed-invalid") == before

        # TOML that does not parse: the line the daemon names is marked instead
        set_value(b, "#lk-edit-source", shown + "spec = [not toml\n")
        b.find("#lk-edit-save").click()
        b.wait_js("return document.getElementById('lk-edit-status').textContent"
                  ".includes('line 4:')", what="the syntax error at line 4")
        assert "TOML syntax error" in text_of(b, "#lk-edit-status")
        assert text_of(b, "#lk-edit-bad-line") == "4"
        b.screenshot("edit-invalid-toml")
        assert file_bytes(cockpit_site, "ed-invalid") == before


def test_a_members_edit_through_the_form_is_a_one_line_diff(
        cockpit_site: Any, lokid: LokidSystem, models: Models) -> None:
    lokid.preset("ed-form", "# the operator's note stays\n" + MODEL + "\n[chat]\ntop_k = 40\n")
    # the draft picker's files: a copy of the model (a draft model to the daemon) and an
    # MTP head published apart, which the daemon puts first; never the model's own file
    cockpit_site.ct.run(["cp", "/var/lib/loki-models/llama.gguf",
                         "/var/lib/loki-models/ed-draft.gguf"])
    lokid.track_path("/var/lib/loki-models/ed-draft.gguf")
    head = lokid.add_model(models.mtp_head)
    lokid.track_path(f"/var/lib/loki-models/{head}")
    before = file_bytes(cockpit_site, "ed-form").decode()
    with Browser(cockpit_site.url) as b:
        b.login_to_page(cockpit_site.member.user, cockpit_site.member.password)
        open_editor(b, "ed-form")
        assert b.find("#lk-edit-key-ctx").get_attribute("value") == "2048"
        assert b.find("#lk-edit-key-chat-top-k").get_attribute("value") == "40"
        b.wait_js("return [...document.querySelectorAll('#lk-edit-key-spec-draft option')]"
                  ".some(o => o.value === 'ed-draft.gguf')", what="the draft candidate")
        offered = b.driver.execute_script(
            "return [...document.querySelectorAll('#lk-edit-key-spec-draft option')]"
            ".map(o => o.value)")
        assert offered == ["", head, "ed-draft.gguf"], offered

        set_value(b, "#lk-edit-key-ctx", "4096")
        b.find("#lk-edit-apply").click()
        b.wait_js("return document.getElementById('lk-edit-status').textContent"
                  ".startsWith('Saved: ctx')", what="the form's save")
        # the editor shows the file as written, at its new version
        b.wait_js("return document.getElementById('lk-edit-source').value.includes('ctx = 4096')",
                  what="the new text in the editor")
        b.screenshot("edit-form-ctx")
    after = file_bytes(cockpit_site, "ed-form").decode()
    changed = [line for line in difflib.unified_diff(before.splitlines(), after.splitlines(),
                                                     lineterm="", n=0)
               if line[:1] in "+-" and not line.startswith(("+++", "---"))]
    assert changed == ["-ctx = 2048", "+ctx = 4096"], changed


def test_a_file_changed_elsewhere_is_never_overwritten_and_reload_shows_it(
        cockpit_site: Any, lokid: LokidSystem) -> None:
    port = lokid.preset("ed-conflict", MODEL)
    with Browser(cockpit_site.url) as b:
        b.login_to_page(cockpit_site.member.user, cockpit_site.member.password)
        open_editor(b, "ed-conflict")
        # a shell writes the file while the page has it open
        shell = f"port = {port}\nctx = 1024\n{MODEL}# written from a shell\n"
        lokid.write_preset_text("ed-conflict", shell, reload=False)
        page = str(b.driver.execute_script(
            "return document.getElementById('lk-edit-source').value"))
        set_value(b, "#lk-edit-source", page.replace("ctx = 2048", "ctx = 3072"))
        b.find("#lk-edit-save").click()
        b.find("#lk-edit-conflict")
        assert "Changed elsewhere" in text_of(b, "#lk-edit-conflict")
        b.screenshot("edit-conflict")
        assert file_bytes(cockpit_site, "ed-conflict").decode() == shell
        b.find("#lk-edit-reload").click()
        b.wait_js("return document.getElementById('lk-edit-source').value === arguments[0]",
                  shell, what="the shell's text after Reload")
        assert b.find("#lk-edit-key-ctx").get_attribute("value") == "1024"
        assert not b.find("#lk-edit-source").get_attribute("readonly")
        b.screenshot("edit-conflict-reloaded")
    assert file_bytes(cockpit_site, "ed-conflict").decode() == shell


def test_an_outsiders_edit_is_refused_in_words_and_the_file_unchanged(
        cockpit_site: Any, lokid: LokidSystem) -> None:
    lokid.preset("ed-outsider", MODEL)
    before = file_bytes(cockpit_site, "ed-outsider")
    with Browser(cockpit_site.url) as b:
        b.login_to_page(cockpit_site.outsider.user, cockpit_site.outsider.password)
        open_editor(b, "ed-outsider", readable=False)
        # the daemon (polkit) keeps the file from them: the page says so, shows no text
        status = text_of(b, "#lk-edit-status")
        assert "Not permitted" in status, status
        assert b.driver.execute_script(
            "return document.getElementById('lk-edit-source').value") == ""
        # the form can be tried; the daemon refuses the edit in words
        set_value(b, "#lk-edit-key-ctx", "4096")
        b.find("#lk-edit-apply").click()
        b.wait_js("return document.getElementById('lk-edit-status').textContent"
                  ".startsWith('The keys were not saved: Not permitted')",
                  what="the refused edit")
        b.screenshot("edit-outsider-refused")
        # and so is a removal
        b.find("#lk-edit-delete").click()
        b.find("#lk-edit-delete-yes").click()
        b.wait_js("return document.getElementById('lk-edit-manage-message').textContent"
                  ".includes('Not permitted')", what="the refused delete")
        assert not b.driver.find_element("css selector", "#lk-edit-force").is_displayed()
    time.sleep(1)
    assert file_bytes(cockpit_site, "ed-outsider") == before


def test_a_preset_is_created_renamed_and_deleted_from_the_page(
        cockpit_site: Any, lokid: LokidSystem) -> None:
    for name in ("ed-new", "ed-renamed"):
        lokid.track_path(f"{PRESETS}/{name}.toml")
        lokid.track_unit(unit(name))
    lokid.preset("ed-seed", MODEL)
    with Browser(cockpit_site.url) as b:
        b.login_to_page(cockpit_site.member.user, cockpit_site.member.password)
        b.wait_text("ed-seed")
        b.find("#lk-create summary").click()
        # the form starts from a model the daemon serves
        b.wait_js("return document.getElementById('lk-create-text').value"
                  ".startsWith('model = ')", what="the new preset's starting text")
        set_value(b, "#lk-create-name", "ed-new")
        set_value(b, "#lk-create-text", 'ctx = "big"\n' + MODEL)
        b.find("#lk-create-go").click()
        b.wait_js("return document.getElementById('lk-create-message').textContent"
                  ".includes('line 1:')", what="the refused text, at its line")
        assert not exists(cockpit_site, "ed-new")
        set_value(b, "#lk-create-text", "ctx = 2048\n" + MODEL)
        b.find("#lk-create-go").click()
        b.wait_js("return (document.getElementById('lk-preset-name') || {}).textContent"
                  " === 'ed-new'", what="the new preset's view")
        assert file_bytes(cockpit_site, "ed-new") == ("ctx = 2048\n" + MODEL).encode()
        b.wait_js("return document.getElementById('lk-edit-source').value.startsWith('ctx')",
                  what="its file in the editor")
        b.screenshot("edit-created")

        set_value(b, "#lk-edit-new-name", "ed-renamed")
        b.find("#lk-edit-rename").click()
        b.wait_js("return (document.getElementById('lk-preset-name') || {}).textContent"
                  " === 'ed-renamed'", what="the renamed preset's view")
        assert not exists(cockpit_site, "ed-new")
        assert file_bytes(cockpit_site, "ed-renamed") == ("ctx = 2048\n" + MODEL).encode()
        b.wait_js("return document.getElementById('lk-edit-source').value.startsWith('ctx')",
                  what="the renamed preset's file in the editor")
        b.screenshot("edit-renamed")

        b.find("#lk-edit-delete").click()
        assert b.find("#lk-edit-confirm").is_displayed()
        assert exists(cockpit_site, "ed-renamed")     # nothing before the confirmation
        b.screenshot("edit-delete-confirm")
        b.find("#lk-edit-delete-yes").click()
        b.find("#lk-overview")
        b.wait_js("return !document.querySelector(\"tr[data-preset='ed-renamed']\")",
                  what="the deleted preset gone from the overview")
        assert not exists(cockpit_site, "ed-renamed")
        b.screenshot("edit-deleted")


def test_deleting_a_running_preset_is_refused_until_forced(
        cockpit_site: Any, lokid: LokidSystem) -> None:
    lokid.preset("ed-running", MODEL)
    cockpit_site.ct.systemctl("start", unit("ed-running"), timeout=180)
    with Browser(cockpit_site.url) as b:
        b.login_to_page(cockpit_site.member.user, cockpit_site.member.password)
        open_editor(b, "ed-running")
        b.find("#lk-edit-delete").click()
        b.find("#lk-edit-delete-yes").click()
        force = b.find("#lk-edit-force")
        message = text_of(b, "#lk-edit-manage-message")
        assert "is running" in message and "with force" in message, message
        assert exists(cockpit_site, "ed-running")
        b.screenshot("edit-delete-running-refused")
        assert force.text == "Delete with force"
        force.click()
        b.find("#lk-overview", timeout=150)
        b.screenshot("edit-deleted-forced")
    assert not exists(cockpit_site, "ed-running")
    assert lokid.show("ed-running", "ActiveState")["ActiveState"] != "active"
