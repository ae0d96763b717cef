"""The spare step's launcher (lokid.unit.standby.Launcher): a child forked ahead that only
execs the engine when told, with what ``subprocess`` would have given it (its own process
group, /dev/null as input, SIGPIPE as the default), dying with the step that forked it,
and an exec that fails raising OSError as ``subprocess`` does. Real processes."""

from __future__ import annotations

import errno
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from support import REPO
from support.enginekit import alive

from lokid.unit.standby import Launcher

STEP = """
import os, sys, time
sys.path.insert(0, {repo!r})
from lokid.unit.standby import Launcher
launcher = Launcher()
child = launcher.spawn(["sleep", "60"], dict(os.environ))
print(child.pid, flush=True)
time.sleep(60)
"""


def test_the_engine_gets_what_subprocess_would_give_it(tmp_path: Path) -> None:
    out = tmp_path / "out"
    launcher = Launcher()
    script = ('exec >"$OUT"; echo "$X"; readlink /proc/self/fd/0; '
              'grep -E "^SigIgn" /proc/self/status; ps -o pgid= -p $$')
    child = launcher.spawn(["sh", "-c", script], {"X": "told", "OUT": str(out),
                                                  "PATH": os.environ["PATH"]})
    assert child.wait() == 0 and child.poll() == 0
    x, stdin, sigign, pgid = out.read_text().split("\n")[:4]
    assert x == "told"
    assert stdin == "/dev/null"
    assert int(sigign.split()[1], 16) & (1 << (signal.SIGPIPE - 1)) == 0
    assert int(pgid) == child.pid   # its own group: a signal to it reaches it alone


def test_an_exec_that_fails_raises_as_subprocess_does(tmp_path: Path) -> None:
    launcher = Launcher()
    with pytest.raises(OSError) as e:
        launcher.spawn([str(tmp_path / "no-such-engine")], {})
    assert e.value.errno == errno.ENOENT


def test_the_engine_dies_with_the_step_that_forked_it() -> None:
    step = subprocess.Popen([sys.executable, "-c", STEP.format(repo=str(REPO))],
                            stdout=subprocess.PIPE, text=True)
    try:
        assert step.stdout is not None
        engine = int(step.stdout.readline())
        assert alive(engine)
        step.send_signal(signal.SIGKILL)   # no cleanup of its own: PR_SET_PDEATHSIG only
        step.wait(10)
        deadline = time.monotonic() + 10
        while alive(engine):
            assert time.monotonic() < deadline, "the engine outlived its step"
            time.sleep(0.05)
    finally:
        if step.poll() is None:
            step.kill()


def test_a_launcher_never_told_leaves_nothing(tmp_path: Path) -> None:
    launcher = Launcher()
    pid = launcher.pid
    assert alive(pid)
    launcher.close()   # its input ends: it exits, and is reaped
    assert not Path(f"/proc/{pid}").exists() or not alive(pid)
