"""lokid.store.presetstore on real files and real threads: a hand edit saved while an edit
is made is never overwritten (Busy instead), an edit of one preset never waits for another's,
a stopping daemon cancels an edit before it writes, new presets are 0640 in the manage
group, and the temporary files a killed daemon left are removed (its own, old ones only)."""

from __future__ import annotations

import fcntl
import grp
import logging
import os
import random
import re
import threading
import time
from pathlib import Path

import pytest

from lokid.core.config import files as cfg
from lokid.core.config import presetedit
from lokid.core.errors import BusyError, ConfigError
from lokid.store import presetstore
from lokid.store.presetstore import STALE_TMP_SECONDS, PresetStore

TEXT = '# a hand-written preset\nmodel = "m.gguf"\nctx = 2048\n'


@pytest.fixture
def store(tmp_path: Path) -> PresetStore:
    (tmp_path / "presets").mkdir()
    (tmp_path / "presets" / "p.toml").write_text(TEXT)
    return PresetStore(str(tmp_path))


def hand_write(path: Path, text: str, by_rename: bool) -> None:
    """An operator's save: by a rename (vim, most editors), or in place (nano, `>`)."""
    if by_rename:
        tmp = path.with_name(f"{path.name}~")
        tmp.write_text(text)
        os.replace(tmp, path)
    else:
        with open(path, "w") as f:
            f.write(text)


def test_a_hand_edit_saved_while_an_edit_is_planned_is_busy_never_overwritten(
        store: PresetStore, tmp_path: Path) -> None:
    """The hand edit lands at the worst moment: after the store read the file and while it
    plans the new text (``check``). Today's main replaced it with the daemon's text (the
    version was checked only as the file was read), every round."""
    file = tmp_path / "presets" / "p.toml"
    overwritten = busy = 0
    for n in range(40):
        source = store.read("p")
        hand = source.text.replace("ctx = ", f"# hand edit {n}\nctx = ")

        def check(path: str, text: str, hand: str = hand, n: int = n) -> None:
            cfg.parse_preset_text("p", path, text)
            hand_write(file, hand, by_rename=n % 2 == 0)

        try:
            store.write("p", lambda text, n=n: presetedit.set_keys(text or "",
                                                                   {"ctx": 4096 + n}),
                        source.etag, check)
        except BusyError as e:
            assert "was changed by another program while this edit was made" in str(e)
            busy += 1
        if file.read_text() != hand:
            overwritten += 1
    assert (overwritten, busy) == (0, 40)
    assert sorted(p.name for p in (tmp_path / "presets").iterdir()) == ["p.toml"]


def test_a_writer_in_a_loop_that_takes_the_directory_lock_never_loses_an_edit(
        store: PresetStore, tmp_path: Path) -> None:
    """A script rewriting the file in a loop (in place and by rename), taking
    ``flock presets/`` as documented, against 150 versioned edits that each plan their
    text: every hand edit survives (the script checks, under the lock, that the file
    still holds its last one). Today's main lost some of them."""
    file = tmp_path / "presets" / "p.toml"
    stop = threading.Event()
    lost: list[tuple[int, int]] = []
    written = [0]

    def writer() -> None:
        last = 0
        fd = os.open(tmp_path / "presets", os.O_RDONLY | os.O_DIRECTORY)
        try:
            while not stop.is_set():
                fcntl.flock(fd, fcntl.LOCK_EX)
                try:
                    found = re.search(r"# hand (\d+)", file.read_text())
                    seen = int(found.group(1)) if found else 0
                    if seen != last:
                        lost.append((last, seen))
                    last += 1
                    text = re.sub(r"# hand \d+\n", "", file.read_text())
                    hand_write(file, f"# hand {last}\n{text}", by_rename=last % 2 == 0)
                    written[0] = last
                finally:
                    fcntl.flock(fd, fcntl.LOCK_UN)
                time.sleep(random.uniform(0.001, 0.008))
        finally:
            os.close(fd)

    thread = threading.Thread(target=writer)
    thread.start()
    done = busy = 0
    try:
        # 150 edits at least, and on until the script wrote 20 times too (on a busy
        # machine 150 edits could end before it had: 15 once); bounded all the same
        for n in range(5000):
            if n >= 150 and written[0] > 20:
                break
            source = store.read("p")

            def check(path: str, text: str) -> None:
                cfg.parse_preset_text("p", path, text)   # the planning's parse
                time.sleep(0.002)                        # and the rest of its time

            try:
                store.write("p", lambda text, n=n: presetedit.set_keys(text or "",
                                                                       {"ctx": 1024 + n}),
                            source.etag, check)
                done += 1
            except BusyError:
                busy += 1
            except ConfigError:   # read while the script rewrote it in place: refused too
                busy += 1
    finally:
        stop.set()
        thread.join(10)
    assert lost == [], f"{len(lost)} hand edits of {written[0]} overwritten"
    assert done > 0 and busy > 0 and written[0] > 20, (done, busy, written)


def test_an_edit_of_one_preset_does_not_wait_for_a_slow_edit_of_another(
        store: PresetStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "presets" / "b.toml").write_text(TEXT)
    planning_b, release_b = threading.Event(), threading.Event()

    def slow(path: str, text: str) -> None:
        planning_b.set()
        assert release_b.wait(30)

    b = threading.Thread(target=store.write, args=("b", lambda t: (t or "") + "# b\n", "",
                                                   slow))
    b.start()
    try:
        assert planning_b.wait(10)
        a = threading.Thread(target=store.write, args=("p", lambda t: (t or "") + "# a\n"))
        a.start()
        a.join(5)
        assert not a.is_alive(), "the edit of p waited for the edit of b"
        assert (tmp_path / "presets" / "p.toml").read_text().endswith("# a\n")
        # the same preset still waits: one writer per preset
        again = threading.Thread(target=store.write, args=("b", lambda t: (t or "") + "# 2\n"))
        again.start()
        again.join(0.5)
        assert again.is_alive()
        # but not for ever (the daemon's worker threads are few): Busy after LOCK_WAIT
        monkeypatch.setattr(presetstore, "LOCK_WAIT", 0.3)
        with pytest.raises(BusyError, match="another edit of preset 'b' has run for more"):
            store.write("b", lambda t: (t or "") + "# 3\n")
    finally:
        release_b.set()
        b.join(10)
    again.join(10)
    assert (tmp_path / "presets" / "b.toml").read_text().endswith("# b\n# 2\n")
    assert store._locks == {}   # a lock lives only while it is held or waited for


def test_a_stopping_daemon_cancels_an_edit_before_it_writes(store: PresetStore,
                                                            tmp_path: Path) -> None:
    file = tmp_path / "presets" / "p.toml"

    def stop_meanwhile(path: str, text: str) -> None:
        store.close()   # SIGTERM while the edit is planned

    with pytest.raises(BusyError, match="lokid is stopping"):
        store.write("p", lambda t: (t or "") + "# late\n", "", stop_meanwhile)
    assert file.read_text() == TEXT
    with pytest.raises(BusyError, match="lokid is stopping"):   # between two keys, too
        store.write("p", lambda t: presetedit.set_keys(t or "", {"a": 1, "b": 2},
                                                       store.cancelled))
    assert [p.name for p in (tmp_path / "presets").iterdir()] == ["p.toml"]


def test_a_new_preset_is_0640_in_the_manage_group(tmp_path: Path,
                                                  caplog: pytest.LogCaptureFixture) -> None:
    (tmp_path / "presets").mkdir()
    other = grp.getgrnam("daemon")   # any group but ours stands for loki here
    assert other.gr_gid != os.getgid()
    store = PresetStore(str(tmp_path), group="daemon")
    store.write("new", lambda _: TEXT, create=True)
    st = (tmp_path / "presets" / "new.toml").stat()
    assert (oct(st.st_mode & 0o777), st.st_gid, st.st_uid) == ("0o640", other.gr_gid,
                                                               os.getuid())
    # an existing file keeps its owner and mode
    os.chmod(tmp_path / "presets" / "new.toml", 0o600)
    os.chown(tmp_path / "presets" / "new.toml", -1, os.getgid())
    store.write("new", lambda t: (t or "") + "# more\n")
    st = (tmp_path / "presets" / "new.toml").stat()
    assert (oct(st.st_mode & 0o777), st.st_gid) == ("0o600", os.getgid())
    # no such group (development): the daemon's own group, said in the log
    caplog.set_level(logging.WARNING, logger="lokid.daemon")
    PresetStore(str(tmp_path), group="no-such-group-here").write("dev", lambda _: TEXT,
                                                                 create=True)
    st = (tmp_path / "presets" / "dev.toml").stat()
    assert (oct(st.st_mode & 0o777), st.st_gid) == ("0o640", os.getgid())
    assert "no group 'no-such-group-here' on this host" in caplog.text


def test_a_create_never_replaces_a_file_made_meanwhile(store: PresetStore,
                                                       tmp_path: Path) -> None:
    file = tmp_path / "presets" / "q.toml"

    def by_hand(path: str, text: str) -> None:
        file.write_text("# by hand\n")

    with pytest.raises(BusyError, match="was created by another program"):
        store.write("q", lambda _: TEXT, create=True, check=by_hand)
    assert file.read_text() == "# by hand\n"


def test_stale_temporary_files_of_the_store_are_removed_and_nothing_else(
        tmp_path: Path) -> None:
    presets = tmp_path / "presets"
    presets.mkdir()
    old = time.time() - STALE_TMP_SECONDS - 60
    names = {".p.toml.4242.139872.tmp": old,          # a killed daemon's: removed
             ".p.toml.4243.139872.tmp": time.time(),  # a write under way: kept
             ".p.toml.swp": old,                      # an editor's: kept
             "notes.tmp": old,                        # the operator's: kept
             ".x.toml.1.tmp~": old}                   # not the store's name: kept
    for name, when in names.items():
        (presets / name).write_text("x")
        os.utime(presets / name, (when, when))
    store = PresetStore(str(tmp_path))   # the daemon starts
    assert sorted(p.name for p in presets.iterdir()) == sorted(set(names) - {
        ".p.toml.4242.139872.tmp"})
    os.utime(presets / ".p.toml.4243.139872.tmp", (old, old))
    store.write("p", lambda _: TEXT, create=True)   # and before a write
    assert ".p.toml.4243.139872.tmp" not in os.listdir(presets)
