"""lokid.store.oncpunote: the daemon's note that a start runs on the CPU is read by that
start alone, once, bounded, and never raises (issue 44, item 3)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from lokid.store.oncpunote import (
    MAX_BYTES,
    MAX_REASON,
    Note,
    note_path,
    read_note,
    take_note,
    write_note,
)
from lokid.store.runtimefiles import remove_preset_files


def test_a_note_is_its_starts_alone_and_taken_once(tmp_path: Path) -> None:
    run = str(tmp_path)
    write_note(run, "p", Note("inv-1", True, "its GPU backend did not start (CUDA: …)"))
    assert read_note(run, "p", "inv-2") is None   # a later start never reads an earlier's
    assert take_note(run, "p", "inv-2") is None and os.path.exists(note_path(run, "p"))
    assert read_note(run, "p", "") is None        # a start without an id is told nothing
    note = take_note(run, "p", "inv-1")
    assert note is not None and note.fail and note.reason.startswith("its GPU backend")
    assert not os.path.exists(note_path(run, "p")) and take_note(run, "p", "inv-1") is None
    write_note(run, "p", Note("inv-3", False, "it says offloaded 3/3 layers"))
    assert "p.oncpu" in remove_preset_files(run, "p")


def test_a_note_is_one_bounded_line_whatever_wrote_it(tmp_path: Path) -> None:
    run = str(tmp_path)
    write_note(run, "p", Note("inv", False, "CUDA: bad\nREADY=1\x00MAINPID=1 " + "x" * 5000))
    note = read_note(run, "p", "inv")
    assert note is not None and not note.fail
    assert "\n" not in note.reason and "\x00" not in note.reason
    assert note.reason.startswith("CUDA: bad READY=1 MAINPID=1 x")
    assert len(note.reason) == MAX_REASON and note.reason.endswith("…")
    # written by another hand (the engine runs as the same user as its step)
    path = Path(note_path(run, "p"))
    path.write_text("lokid-oncpu 1\ninv\nfail\n" + "y" * MAX_BYTES + "\n")
    assert read_note(run, "p", "inv") is None     # longer than a note can be: damaged
    for text in ("", "garbage", "lokid-oncpu 1\ninv\nstop\nwhy\n", "lokid-oncpu 2\ninv\nrun\nw\n",
                 "lokid-oncpu 1\ninv\nrun\n"):
        path.write_text(text)
        assert read_note(run, "p", "inv") is None, text
    path.write_bytes(b"lokid-oncpu 1\ninv\nrun\n\xff\xfe\x1b[31m\n")
    note = read_note(run, "p", "inv")
    assert note is not None and "\x1b" not in note.reason
    path.unlink()
    path.mkdir()                                  # not a file: no note, no error
    assert read_note(run, "p", "inv") is None and take_note(run, "p", "inv") is None


def test_an_invocation_that_could_never_match_is_refused(tmp_path: Path) -> None:
    for bad in ("", "inv 1", "inv\n1"):
        with pytest.raises(ValueError):
            write_note(str(tmp_path), "p", Note(bad, False, "why"))
    assert os.listdir(tmp_path) == []
