"""The crash-loop rule: which failures stop automatic restarts, and what they are called."""

from __future__ import annotations

import pytest

from lokid.core.launch.crashloop import BURST, WINDOW, Failure, exit_reason, progress, stop_reason

NOW = 1_000_000.0


def failures(*ages: float, ready: bool = False) -> list[Failure]:
    return [Failure(NOW - age, ready, f"failure {i}") for i, age in enumerate(ages)]


def test_five_failures_inside_the_window_stop_restarts() -> None:
    assert stop_reason(failures(400, 300, 200, 100), NOW) == ""
    why = stop_reason(failures(400, 300, 200, 100, 0), NOW)
    assert why.startswith("5 failures in 10 min (the last: failure 4)")


def test_old_failures_fall_out_of_the_window() -> None:
    ready = [Failure(NOW - age, True, "x") for age in (WINDOW + 50, WINDOW + 10, 300, 200, 100)]
    assert stop_reason(ready, NOW) == ""


def test_starts_that_never_become_ready_stop_even_when_slow() -> None:
    """A big model that takes minutes to fail never reaches 5 in 10 minutes."""
    slow = failures(*(WINDOW * k for k in range(BURST, 0, -1)))
    assert stop_reason(slow, NOW).startswith("5 starts in a row never became ready")
    # one start that became ready breaks the streak
    broken = [*slow[:2], Failure(slow[2].at, True, "served"), *slow[3:]]
    assert stop_reason(broken, NOW) == ""


def test_progress_says_where_a_restart_stands() -> None:
    assert progress([], NOW) == ""
    assert "2 of 5" in progress(failures(20, 10), NOW)


@pytest.mark.parametrize("result,code,status,ready,expected", [
    ("success", "killed", "TERM", False, ""),          # the operator's stop, even loading
    ("success", "exited", "0", True, ""),
    ("exit-code", "exited", "78", False, ""),          # lokid refused: not the engine
    ("exit-code", "exited", "69", False, ""),
    ("exit-code", "exited", "1", False, "the engine helper exited with status 1 while loading"),
    ("signal", "killed", "KILL", True, "the engine was killed by signal KILL after it was ready"),
    ("core-dump", "dumped", "ABRT", False, "the engine was killed by signal ABRT while loading "
     "(core dumped)"),
    ("watchdog", "killed", "ABRT", True, "the engine stopped answering /health after it was "
     "ready (watchdog)"),
    ("timeout", "killed", "TERM", False, "the engine did not load within the start timeout"),
])
def test_how_systemd_ended_a_start(result: str, code: str, status: str, ready: bool,
                                   expected: str) -> None:
    assert exit_reason(result, code, status, ready=ready) == expected
