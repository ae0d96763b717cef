"""The note a GPU group's start leaves for its engine step (lokid.store.holds): taken once,
never one whose time is past, never a damaged one; and removed with its preset."""

from __future__ import annotations

import os
import time
from pathlib import Path

from lokid.store.holds import LONGEST, Hold, drop_hold, take_hold, write_hold
from lokid.store.runtimefiles import remove_preset_files


def test_a_note_is_taken_once(tmp_path: Path) -> None:
    hold = Hold(("alpha",), (1234, 1240), time.monotonic() + 60)
    write_hold(str(tmp_path), "beta", hold)
    assert take_hold(str(tmp_path), "beta") == hold
    assert take_hold(str(tmp_path), "beta") is None   # removed by the start that took it
    assert take_hold(str(tmp_path), "alpha") is None   # one preset's note is its own


def test_no_note_holds_a_start_longer_than_its_bound(tmp_path: Path) -> None:
    write_hold(str(tmp_path), "beta", Hold(("alpha",), (1234,), time.monotonic() + 1e9))
    hold = take_hold(str(tmp_path), "beta")
    assert hold is not None and hold.until <= time.monotonic() + LONGEST


def test_a_note_whose_time_is_past_is_none_and_goes(tmp_path: Path) -> None:
    write_hold(str(tmp_path), "beta", Hold(("alpha",), (1234,), time.monotonic() - 1))
    assert take_hold(str(tmp_path), "beta") is None
    assert not (tmp_path / "beta.after").exists()


def test_a_damaged_note_is_none_and_goes(tmp_path: Path) -> None:
    for text in ("{", '{"names": ["a"], "pids": ["x"], "until": 1e12}', "[]", "null"):
        (tmp_path / "beta.after").write_text(text)
        assert take_hold(str(tmp_path), "beta") is None, text
        assert not (tmp_path / "beta.after").exists(), text
    drop_hold(str(tmp_path), "beta")   # none there: nothing to say


def test_the_note_goes_with_its_preset(tmp_path: Path) -> None:
    write_hold(str(tmp_path), "beta", Hold(("alpha",), (1234,), time.monotonic() + 60))
    assert "beta.after" in remove_preset_files(str(tmp_path), "beta")
    assert os.listdir(tmp_path) == []
