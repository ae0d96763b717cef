"""Editing presets over D-Bus: the real daemon (local runner) on a private real dbus-daemon,
the real engine and generated GGUF files.

Every rule of the editing methods: validation before any write (a refused edit leaves
the file byte for byte), atomic writes that keep owner and mode, versions (two editors:
one wins, the other is Busy, no update lost), comments kept, the guards on removing or
renaming what runs or what another preset uses, bench results and failures following
the preset, PendingRestart, draft candidates, and who may call what.
"""

from __future__ import annotations

import asyncio
import difflib
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from dbus_fast import DBusError, Variant
from support import REPO
from support import models as gen
from support.daemonkit import Running, daemon_on
from support.enginekit import free_port, write_config, write_preset

from lokid.core.launch.attempt import Mark
from lokid.core.names import BUS_NAME, OBJECT_PATH, PRESET_INTERFACE, preset_object_path
from lokid.core.names import MANAGER_INTERFACE as MANAGER
from lokid.store.state import SavedBench, StateDB

pytestmark = [pytest.mark.engine, pytest.mark.slow]

EXAMPLE = REPO / "etc" / "presets" / "example.toml"


@pytest.fixture
def config(tmp_path: Path, engine: str, models: Any) -> Path:
    config = write_config(tmp_path, engine, [models.dir])
    # the shipped annotated example, on the generated model and a port of its own
    text = EXAMPLE.read_text().replace('model = "Qwen3-8B-Q4_K_M.gguf"', 'model = "llama.gguf"')
    text = text.replace("#port = 8081", f"port = {free_port()}")
    text = text.replace("\nexample = true\n", "\n")   # made an operator's preset
    assert 'model = "llama.gguf"' in text
    (config / "presets" / "example.toml").write_text(text)
    Path(models.llama)  # written
    return config


def preset_text(port: int, extra: str = "") -> str:
    return f'# a preset made over the bus\nmodel = "llama.gguf"\nctx = 2048\nport = {port}\n' \
        + extra


async def manager(running: Running) -> Any:
    return await running.iface(OBJECT_PATH, MANAGER)


def only_changed_lines(before: str, after: str) -> list[str]:
    return [line for line in difflib.unified_diff(before.splitlines(), after.splitlines(),
                                                  lineterm="", n=0)
            if line[:1] in "+-" and not line.startswith(("+++", "---"))]


async def test_create_read_and_a_refused_create(running: Running, config: Path) -> None:
    m = await manager(running)
    port = free_port()
    path, version = await m.call_create_preset("fresh", preset_text(port))
    assert path == preset_object_path("fresh") and version.startswith("sha256:")
    file = config / "presets" / "fresh.toml"
    assert file.read_text() == preset_text(port)
    assert oct(file.stat().st_mode & 0o777) == "0o640"   # env may hold tokens
    # the object exists on return, with the plan of the new file
    preset = await running.iface(path, PRESET_INTERFACE)
    assert "--port" in (argv := await preset.get_argv()) and str(port) in argv
    text, again = await m.call_get_preset_source("fresh")
    assert (text, again) == (preset_text(port), version)
    # a name that exists: Busy, nothing touched
    with pytest.raises(DBusError, match="exists already") as e:
        await m.call_create_preset("fresh", "model = 'x.gguf'\n")
    assert e.value.type == "org.lokid.Lokid1.Error.Busy"
    assert file.read_text() == preset_text(port)
    # a text that cannot be planned: the planner's error, with file, line and valid values
    with pytest.raises(DBusError) as e:
        await m.call_create_preset("typo", preset_text(free_port(), '[spec]\nmode = "eagle"\n'))
    assert e.value.type == "org.lokid.Lokid1.Error.InvalidPreset"
    assert "typo.toml:6" in e.value.text and "spec.mode" in e.value.text, e.value.text
    assert "mtp" in e.value.text and "ngram" in e.value.text, e.value.text
    assert not (config / "presets" / "typo.toml").exists()
    assert not [p for p in (config / "presets").iterdir() if p.name.startswith(".")]
    # a model that is not there
    with pytest.raises(DBusError, match="absent.gguf") as e:
        await m.call_create_preset("nomodel", 'model = "absent.gguf"\n')
    assert e.value.type == "org.lokid.Lokid1.Error.InvalidPreset"


async def test_one_key_changes_one_line_of_the_annotated_example(running: Running,
                                                                 config: Path) -> None:
    m = await manager(running)
    file = config / "presets" / "example.toml"
    before = file.read_text()
    _, version = await m.call_get_preset_source("example")
    new = await m.call_set_preset_keys("example", {"ctx": Variant("x", 8192)}, version)
    after = file.read_text()
    assert only_changed_lines(before, after) == ["-ctx = 32768", "+ctx = 8192"]
    assert new != version
    preset = await running.iface(preset_object_path("example"), PRESET_INTERFACE)
    assert "8192" in await preset.get_argv()
    # a table key, a new table key, a list: still only their lines
    await m.call_set_preset_keys("example", {"spec.mode": Variant("s", "ngram"),
                                             "chat.temperature": Variant("d", 0.5)}, "")
    changed = only_changed_lines(after, file.read_text())
    assert sorted(changed) == sorted(['-mode = "off"', '+mode = "ngram"',
                                      "+temperature = 0.5"]), changed
    await m.call_unset_preset_keys("example", ["chat.temperature"], "")
    assert "temperature = 0.5" not in file.read_text()
    with pytest.raises(DBusError, match="spec.n_max") as e:
        await m.call_unset_preset_keys("example", ["spec.n_max"], "")
    assert e.value.type == "org.lokid.Lokid1.Error.InvalidPreset"


async def test_a_refused_edit_leaves_the_file_byte_for_byte(running: Running,
                                                            config: Path) -> None:
    m = await manager(running)
    file = config / "presets" / "example.toml"
    os.chmod(file, 0o640)
    shutil.chown(file, "nobody", "nogroup")
    before, stat = file.read_bytes(), file.stat()
    for values in ({"spec.mode": Variant("s", "eagle")}, {"ctx": Variant("s", "big")},
                   {"model": Variant("s", "absent.gguf")}, {"spec.mode.x": Variant("s", "a")},
                   {"port": Variant("x", 0)}):
        with pytest.raises(DBusError) as e:
            await m.call_set_preset_keys("example", values, "")
        assert e.value.type == "org.lokid.Lokid1.Error.InvalidPreset", (values, e.value.text)
    with pytest.raises(DBusError) as e:
        await m.call_update_preset("example", "model = [\n", "")
    assert "TOML syntax error" in e.value.text
    assert file.read_bytes() == before and file.stat().st_mtime_ns == stat.st_mtime_ns
    # a valid edit keeps the owner and the mode
    await m.call_set_preset_keys("example", {"ctx": Variant("x", 4096)}, "")
    after = file.stat()
    assert (after.st_uid, after.st_gid, after.st_mode) == (stat.st_uid, stat.st_gid,
                                                           stat.st_mode)
    assert after.st_ino != stat.st_ino  # replaced by a rename, not rewritten in place


async def test_two_editors_at_once_one_wins_and_no_update_is_lost(running: Running,
                                                                  config: Path) -> None:
    m = await manager(running)
    file = config / "presets" / "example.toml"
    text, version = await m.call_get_preset_source("example")
    mine, theirs = text.replace("ctx = 32768", "ctx = 4096"), text.replace("ctx = 32768",
                                                                          "ctx = 8192")
    results = await asyncio.gather(m.call_update_preset("example", mine, version),
                                   m.call_update_preset("example", theirs, version),
                                   return_exceptions=True)
    errors = [r for r in results if isinstance(r, DBusError)]
    assert len(errors) == 1 and errors[0].type == "org.lokid.Lokid1.Error.Busy", results
    assert "changed since it was read" in errors[0].text
    winner = mine if isinstance(results[1], DBusError) else theirs
    assert file.read_text() == winner
    # key-level changes without a version: both land
    await asyncio.gather(
        m.call_set_preset_keys("example", {"chat.top_k": Variant("x", 20)}, ""),
        m.call_set_preset_keys("example", {"chat.min_p": Variant("d", 0.05)}, ""))
    final = file.read_text()
    assert "top_k = 20" in final and "min_p = 0.05" in final
    # an update over a version that is gone
    with pytest.raises(DBusError, match="changed since it was read"):
        await m.call_update_preset("example", text, version)


async def test_remove_and_rename_guard_what_runs_and_what_others_use(
        running: Running, config: Path, models: Any, tmp_path: Path) -> None:
    m = await manager(running)
    port = free_port()
    await m.call_create_preset("main", preset_text(port))
    # another preset takes main's model file as its draft
    await m.call_create_preset("user", preset_text(free_port(), '[spec]\nmode = "mtp"\n'
                                                   'draft = "llama.gguf"\n'))
    state = tmp_path / "state"
    with StateDB(str(state)) as db:
        db.save_bench(SavedBench("main", {"decode_tps": 1.0}, "llama.gguf", "b1", "fp", 1.0))
        db.record_failure("main", Mark("fp", "/engine", 1), "it never answered")
    with pytest.raises(DBusError, match="draft of user") as e:
        await m.call_delete_preset("main", False)
    assert e.value.type == "org.lokid.Lokid1.Error.Busy"
    with pytest.raises(DBusError, match="draft of user"):
        await m.call_rename_preset("main", "main2", False)
    # renaming moves the records; the old name has nothing left
    await m.call_delete_preset("user", False)
    new_path = await m.call_rename_preset("main", "main2", False)
    assert new_path == preset_object_path("main2")
    assert not (config / "presets" / "main.toml").exists()
    with StateDB(str(state)) as db:
        assert db.bench("main") is None and db.bench("main2") is not None
        assert db.failures("main") == [] and len(db.failures("main2")) == 1
    # a running preset: Busy; with force, stopped first, then removed with its records
    await m.call_start_preset("main2")
    await running.wait_event("main2", "ready")
    with pytest.raises(DBusError, match="is running") as e:
        await m.call_delete_preset("main2", False)
    assert e.value.type == "org.lokid.Lokid1.Error.Busy"
    with pytest.raises(DBusError, match="exists already"):
        await m.call_rename_preset("main2", "example", True)
    await m.call_delete_preset("main2", True)
    assert running.events[-1][:2] == ("main2", "inactive")
    assert not (config / "presets" / "main2.toml").exists()
    with StateDB(str(state)) as db:
        assert db.bench("main2") is None and db.failures("main2") == []
    assert "main2" not in [p.rsplit("/", 1)[-1] for p in await m.get_presets()]


async def test_an_edit_of_a_running_preset_waits_for_its_restart(running: Running) -> None:
    m = await manager(running)
    await m.call_create_preset("live", preset_text(free_port()))
    preset = await running.iface(preset_object_path("live"), PRESET_INTERFACE)
    assert await preset.get_pending_restart() is False
    await m.call_start_preset("live")
    await running.wait_event("live", "ready")
    assert await preset.get_pending_restart() is False
    await m.call_set_preset_keys("live", {"ctx": Variant("x", 1024)}, "")
    assert await preset.get_pending_restart() is True
    seen = len(running.events)
    await m.call_restart_preset("live")
    await running.wait_event("live", "ready", after=seen)
    deadline = time.monotonic() + 10
    while await preset.get_pending_restart():
        assert time.monotonic() < deadline, "PendingRestart stayed true after the restart"
        await asyncio.sleep(0.1)
    await m.call_stop_preset("live")
    await running.wait_event("live", "inactive")


async def test_draft_candidates(tmp_path: Path, engine: str, bus_address: str) -> None:
    """Never the model itself; MTP heads before draft models, those beside the model
    first; a model holding its own head is offered none-needed first; projectors and
    EAGLE-3 heads left out."""
    here, there = tmp_path / "here", tmp_path / "there"
    here.mkdir()
    there.mkdir()
    gen.write_llama(here / "model.gguf")
    gen.write_llama_nextn(here / "mtp-model.gguf")
    gen.write_draft(here / "small.gguf")
    gen.write_meta(here / "mmproj.gguf", "clip")
    gen.write_eagle3(here / "eagle.gguf")
    gen.write_llama_nextn(there / "mtp-elsewhere.gguf")
    (there / "broken.gguf").write_bytes(b"GGUF\x03")
    gen.write_llama_nextn(there / "self-mtp.gguf")
    config = write_config(tmp_path, engine, [here, there])
    write_preset(config, "p", f'model = "model.gguf"\nport = {free_port()}\n')
    write_preset(config, "q", f'model = "self-mtp.gguf"\nport = {free_port()}\n')
    async with daemon_on(config, tmp_path, bus_address) as running:
        m = await manager(running)
        found = [{k: v.value for k, v in c.items()} for c in await m.call_draft_candidates("p")]
        assert [(c["file"], c["kind"], c["beside_model"]) for c in found] == [
            ("mtp-model.gguf", "mtp-head", True),
            ("mtp-elsewhere.gguf", "mtp-head", False),
            ("self-mtp.gguf", "mtp-head", False),
            ("small.gguf", "draft-model", True)], found
        assert all(c["size_mib"] > 0 for c in found)
        q = [{k: v.value for k, v in c.items()} for c in await m.call_draft_candidates("q")]
        assert q[0]["kind"] == "none-needed" and q[0]["file"] == ""
        assert "self-mtp.gguf" not in [c["file"] for c in q]
        with pytest.raises(DBusError) as e:
            await m.call_draft_candidates("nosuch")
        assert e.value.type == "org.lokid.Lokid1.Error.NotFound"


def busctl_as(address: str, user: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["setpriv", f"--reuid={user}", "--regid=nogroup", "--clear-groups",
                           "busctl", f"--address={address}", "call", BUS_NAME, OBJECT_PATH,
                           MANAGER, *args], capture_output=True, text=True, timeout=60)


async def test_an_unprivileged_caller_may_list_drafts_and_nothing_else(
        config: Path, tmp_path: Path, open_bus_address: str) -> None:
    file = config / "presets" / "example.toml"
    before = file.read_bytes()
    async with daemon_on(config, tmp_path, open_bus_address):
        for args in (("GetPresetSource", "s", "example"),
                     ("SetPresetKeys", "sa{sv}s", "example", "1", "ctx", "x", "1024", ""),
                     ("CreatePreset", "ss", "new", "model = 'llama.gguf'"),
                     ("DeletePreset", "sb", "example", "true")):
            r = await asyncio.to_thread(busctl_as, open_bus_address, "nobody", *args)
            assert r.returncode != 0 and "needs root or membership of group" in r.stderr, \
                (args, r.stderr)
        r = await asyncio.to_thread(busctl_as, open_bus_address, "nobody",
                                    "DraftCandidates", "s", "example")
        assert r.returncode == 0, r.stderr
    assert file.read_bytes() == before
    assert not (config / "presets" / "new.toml").exists()


async def test_the_daemons_own_write_is_read_once_and_a_later_hand_edit_is_followed(
        running: Running, config: Path, caplog: pytest.LogCaptureFixture) -> None:
    """The file watcher sees the daemon's own rename; the edit has read the presets
    already, so no second reading follows. An operator's edit right after still is."""
    caplog.set_level("INFO", logger="lokid.daemon")
    m = await manager(running)
    # from here: the fixture's own writes, just before the daemon started, may be seen
    # as a change by its watcher once it runs (a reading then, not the edit's)
    await asyncio.sleep(1.0)
    since = len(caplog.records)
    await m.call_set_preset_keys("example", {"ctx": Variant("x", 4096)}, "")
    await asyncio.sleep(1.0)  # the watcher settles in 0.2 s
    again = [r for r in caplog.records[since:]
             if "configuration files changed" in r.getMessage()]
    assert again == [], [r.getMessage() for r in again]
    file = config / "presets" / "example.toml"
    file.write_text(file.read_text().replace("ctx = 4096", "ctx = 2048"))
    preset = await running.iface(preset_object_path("example"), PRESET_INTERFACE)
    deadline = time.monotonic() + 5
    while "4096" in await preset.get_argv():
        assert time.monotonic() < deadline, "the hand edit was not followed"
        await asyncio.sleep(0.1)
    assert any("configuration files changed" in r.getMessage() for r in caplog.records)


async def test_the_daemons_own_write_is_read_once_even_when_its_reading_waits(
        running: Running, caplog: pytest.LogCaptureFixture) -> None:
    """The reading after an edit runs in a worker thread; on a busy daemon it may start
    after the file watcher's settle time. The write is the daemon's own all the same: no
    second reading (it failed once so in a full run; here the thread is held 0.5 s)."""
    caplog.set_level("INFO", logger="lokid.daemon")
    daemon = running.daemon
    read = daemon._read_files

    def slow() -> None:
        time.sleep(0.5)   # longer than the watcher's settle time
        read()

    daemon._read_files = slow  # type: ignore[method-assign]
    m = await manager(running)
    await m.call_set_preset_keys("example", {"ctx": Variant("x", 4096)}, "")
    await asyncio.sleep(1.0)
    again = [r for r in caplog.records if "configuration files changed" in r.getMessage()]
    assert again == [], [r.getMessage() for r in again]


async def test_a_file_that_is_not_utf8_is_refused_for_every_edit_and_left_alone(
        running: Running, config: Path) -> None:
    file = config / "presets" / "latin.toml"
    file.write_bytes(b'model = "llama.gguf"\n# caf\xe9\n')
    m = await manager(running)
    for call in (lambda: m.call_get_preset_source("latin"),
                 lambda: m.call_set_preset_keys("latin", {"ctx": Variant("x", 1024)}, ""),
                 lambda: m.call_update_preset("latin", 'model = "llama.gguf"\n', "")):
        with pytest.raises(DBusError) as e:
            await call()
        assert e.value.type == "org.lokid.Lokid1.Error.InvalidPreset", e.value.text
        assert "not UTF-8 text (byte 26): edit it by hand" in e.value.text
    assert file.read_bytes() == b'model = "llama.gguf"\n# caf\xe9\n'


async def test_a_broken_preset_beside_a_good_one_is_mended_over_the_bus(
        running: Running, config: Path) -> None:
    (config / "presets" / "broken.toml").write_text(
        f'model = "llama.gguf"\nctx = "big"   # a typo\nport = {free_port()}\n')
    m = await manager(running)
    await m.call_reload()
    assert "broken" in await m.get_broken_presets()
    text, version = await m.call_get_preset_source("broken")
    assert 'ctx = "big"' in text
    await m.call_set_preset_keys("broken", {"ctx": Variant("x", 2048)}, version)
    assert "broken" not in await m.get_broken_presets()
    assert preset_object_path("broken") in await m.get_presets()
    assert "ctx = 2048   # a typo" in (config / "presets" / "broken.toml").read_text()
    assert preset_object_path("example") in await m.get_presets()   # the good one, untouched


async def test_an_edit_of_10000_keys_is_refused_at_once_naming_the_limit(
        running: Running, config: Path) -> None:
    """Today's main worked on it for minutes under the store's one lock."""
    m = await manager(running)
    file = config / "presets" / "example.toml"
    before = file.read_bytes()
    many = {f"env.V{i}": Variant("s", "x") for i in range(10_000)}
    with pytest.raises(DBusError) as e:
        await asyncio.wait_for(m.call_set_preset_keys("example", many, ""), 30)
    assert e.value.type == "org.freedesktop.DBus.Error.InvalidArgs", e.value.text
    assert e.value.text == "10000 keys in one edit: at most 256, as many as a preset file " \
        "may hold"
    with pytest.raises(DBusError, match="at most 256") as e:
        await m.call_unset_preset_keys("example", [f"env.V{i}" for i in range(10_000)], "")
    assert e.value.type == "org.freedesktop.DBus.Error.InvalidArgs"
    with pytest.raises(DBusError, match="bytes of keys and values in one edit") as e:
        await m.call_set_preset_keys("example", {"env.BIG": Variant("s", "x" * 70_000)}, "")
    assert e.value.type == "org.freedesktop.DBus.Error.InvalidArgs"
    assert file.read_bytes() == before
    # a large edit within the bounds is written, in one go
    allowed = {f"env.V{i}": Variant("s", f"v{i}") for i in range(200)}
    await m.call_set_preset_keys("example", allowed, "")
    assert 'V199 = "v199"' in file.read_text()


async def test_removing_or_renaming_a_preset_removes_its_runtime_files(
        running: Running, config: Path, tmp_path: Path) -> None:
    """A preset that ran leaves its plan, its reusable plan and its last ready start in
    the runtime directory; today's main kept them after DeletePreset and RenamePreset."""
    m = await manager(running)
    run = tmp_path / "run"
    for name in ("gone", "moved"):
        await m.call_create_preset(name, preset_text(free_port()))
        await m.call_start_preset(name)
        await running.wait_event(name, "ready")
        await m.call_stop_preset(name)
        await running.wait_event(name, "inactive")
        assert (run / f"{name}.json").exists(), sorted(os.listdir(run))
    (run / "gone.failures").write_text("[]\n")
    (run / "keep.json").write_text("{}\n")   # another preset's: left alone
    await m.call_delete_preset("gone", False)
    await m.call_rename_preset("moved", "there", False)
    left = sorted(p for p in os.listdir(run) if p.startswith(("gone.", "moved.")))
    assert left == [], left
    assert (run / "keep.json").exists()


def test_sigterm_during_a_long_edit_exits_at_once(config: Path, tmp_path: Path,
                                                  bus_address: str) -> None:
    """SIGTERM while an edit of 10,000 keys is under way: today's main ran that edit to
    its end first (minutes) before the daemon could exit."""
    from support.enginekit import NotifyListener

    notify = NotifyListener(tmp_path / "notify")
    env = {**os.environ, "LOKI_STATE_DIR": str(tmp_path / "state"),
           "LOKI_RUNTIME_DIR": str(tmp_path / "run"), "NOTIFY_SOCKET": notify.path}
    proc = subprocess.Popen([sys.executable, "-m", "lokid.cli", "--config-dir", str(config),
                             "daemon", "--bus", "session", "--bus-address", bus_address],
                            env=env, stderr=subprocess.DEVNULL)
    try:
        notify.wait_for("READY=1", timeout=60)
        pairs = [x for i in range(10_000) for x in (f"env.V{i}", "s", "x")]
        for count in ("10000", "200"):   # refused at once; allowed, and quick
            edit = subprocess.Popen(
                ["busctl", f"--address={bus_address}", "--timeout=300", "call", BUS_NAME,
                 OBJECT_PATH, MANAGER, "SetPresetKeys", "sa{sv}s", "example", count,
                 *pairs[:3 * int(count)], ""], stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL)
            time.sleep(0.3)
        t0 = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0
        assert time.monotonic() - t0 < 15
        edit.wait(30)
    finally:
        if proc.poll() is None:
            proc.kill()
        notify.close()


async def test_a_hand_edit_saved_during_bus_edits_is_never_overwritten(
        running: Running, config: Path) -> None:
    """The issue's re-run: an operator's script saves example.toml again and again (by a
    rename, as editors do, under ``flock presets/`` as lokid.8 says) while versioned
    SetPresetKeys calls are planned: each call either lands on the hand edit it read or
    is Busy; none overwrites a later hand edit. Today's main lost some (12 of 37)."""
    import fcntl
    import random
    import re
    import threading

    m = await manager(running)
    presets = config / "presets"
    file = presets / "example.toml"
    stop = threading.Event()
    lost: list[tuple[int, int]] = []
    written = [0]

    def hand_editor() -> None:
        last = 0
        fd = os.open(presets, os.O_RDONLY | os.O_DIRECTORY)
        try:
            while not stop.is_set():
                fcntl.flock(fd, fcntl.LOCK_EX)
                try:
                    text = file.read_text()
                    found = re.search(r"# hand (\d+)\n", text)
                    if (int(found.group(1)) if found else 0) != last:
                        lost.append((last, int(found.group(1)) if found else 0))
                    last += 1
                    tmp = presets / "example.toml~"
                    tmp.write_text(f"# hand {last}\n" + re.sub(r"# hand \d+\n", "", text))
                    os.replace(tmp, file)
                    written[0] = last
                finally:
                    fcntl.flock(fd, fcntl.LOCK_UN)
                time.sleep(random.uniform(0.005, 0.03))
        finally:
            os.close(fd)

    thread = threading.Thread(target=hand_editor)
    thread.start()
    landed = busy = 0
    try:
        for n in range(30):
            _, version = await m.call_get_preset_source("example")
            try:
                await m.call_set_preset_keys("example", {"ctx": Variant("x", 1024 + n)},
                                             version)
                landed += 1
            except DBusError as e:
                assert e.type == "org.lokid.Lokid1.Error.Busy", e.text
                busy += 1
    finally:
        stop.set()
        await asyncio.to_thread(thread.join, 10)
    assert lost == [], f"{len(lost)} of {written[0]} hand edits overwritten"
    assert landed + busy == 30 and written[0] > 5, (landed, busy, written)
