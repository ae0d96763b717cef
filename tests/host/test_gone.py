"""Waiting for processes that are not the waiter's children (lokid.host.gone), with real
processes: one that exits on time, one that outlives the wait, a zombie, and the same
with /proc alone where no pidfd can be had."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from lokid.host import gone


def sleeper(seconds: float) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-c", f"import time; time.sleep({seconds})"])


@pytest.fixture(params=["pidfd", "proc"])
def way(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    if request.param == "proc":   # a kernel (or Python) without pidfd_open
        def no_pidfd(pid: int) -> int:
            raise OSError(38, "Function not implemented")
        monkeypatch.setattr(os, "pidfd_open", no_pidfd)
    return str(request.param)


def test_returns_once_the_process_is_gone_not_before(way: str) -> None:
    proc = sleeper(0.4)
    try:
        t0 = time.monotonic()
        assert gone.wait_gone([proc.pid], time.monotonic() + 10) == []
        took = time.monotonic() - t0
        assert 0.3 <= took < 5, took
        # exited, not yet reaped (the waiter is not its parent's wait): a zombie holds no
        # memory, and it is what a swap's start sees of the daemon's own child
        with open(f"/proc/{proc.pid}/stat") as f:
            assert f.read().rsplit(")", 1)[1].split()[0] == "Z"
    finally:
        proc.wait()


def test_a_process_that_outlives_the_wait_is_named(way: str) -> None:
    slow, quick = sleeper(30), sleeper(0.1)
    try:
        t0 = time.monotonic()
        left = gone.wait_gone([slow.pid, quick.pid], time.monotonic() + 0.5)
        assert left == [slow.pid]
        assert 0.45 <= time.monotonic() - t0 < 5
    finally:
        slow.kill()
        slow.wait()
        quick.wait()


def test_a_process_gone_already_costs_no_wait(way: str) -> None:
    proc = sleeper(0)
    proc.wait()   # reaped: its number names nothing now
    t0 = time.monotonic()
    assert gone.wait_gone([proc.pid], time.monotonic() + 10) == []
    assert time.monotonic() - t0 < 1
    assert gone.wait_gone([], time.monotonic() + 10) == []
