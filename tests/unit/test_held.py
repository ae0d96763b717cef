"""A start's wait for its GPU group's stops in its engine step (lokid.unit.held), with a
real process standing for the engine being stopped: the step goes on once it is gone and
says how long it waited; one still running at the note's time ends the start (status 78
in the step), said in STATUS= and on stderr, rather than load next to it."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from lokid.store.holds import Hold, write_hold
from lokid.unit.held import held


class Told:
    enabled = True
    watchdog_interval = None

    def __init__(self) -> None:
        self.events: list[str] = []

    def send(self, *fields: str) -> None:
        self.events.append(fields[0])


def test_the_start_goes_on_once_the_stopped_engine_is_gone(tmp_path: Path) -> None:
    old = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(0.5)"])
    try:
        write_hold(str(tmp_path), "beta", Hold(("alpha",), (old.pid,), time.monotonic() + 30))
        told = Told()
        t0 = time.monotonic()
        line, refused = held(str(tmp_path), "beta", told)  # type: ignore[arg-type]
        took = time.monotonic() - t0
        assert not refused
        assert 0.4 <= took < 10, took
        assert line.startswith("waited ") and "ms for alpha to stop" in line, line
        assert told.events == ["STATUS=waiting for alpha to stop: one engine of its GPU group "
                               "at a time"]
        assert not (tmp_path / "beta.after").exists()   # taken: the next start waits for none
        assert held(str(tmp_path), "beta", told) == ("", False)
    finally:
        old.wait()


def test_an_engine_still_running_at_the_notes_time_ends_the_start(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    old = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        write_hold(str(tmp_path), "beta", Hold(("alpha",), (old.pid,), time.monotonic() + 0.3))
        told = Told()
        line, refused = held(str(tmp_path), "beta", told)  # type: ignore[arg-type]
        assert refused and line == ""
        assert old.poll() is None
        said = told.events[-1]
        assert said.startswith("STATUS=alpha still running after this start waited") \
            and f"pid {old.pid}" in said
        assert "not loading next to it" in said
        assert "not loading next to it" in capsys.readouterr().err
    finally:
        old.kill()
        old.wait()


def test_no_note_no_wait(tmp_path: Path) -> None:
    told = Told()
    assert held(str(tmp_path), "beta", told) == ("", False)  # type: ignore[arg-type]
    assert told.events == []


def test_a_stopped_engine_gone_already_costs_no_status(tmp_path: Path) -> None:
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    write_hold(str(tmp_path), "beta", Hold(("alpha",), (gone.pid,), time.monotonic() + 30))
    told = Told()
    line, refused = held(str(tmp_path), "beta", told)  # type: ignore[arg-type]
    assert not refused and line == "waited 0 ms for alpha to stop (its GPU group's swap)"
    assert told.events == []   # no "waiting" status flashed for a wait that never was
