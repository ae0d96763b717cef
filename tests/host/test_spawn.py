"""lokid.host.spawn: the engine started with posix_spawn as subprocess.Popen would start it
(real processes)."""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

import pytest

from lokid.host.spawn import spawn

# What the child reports of itself: whether it leads its own process group, and what its
# standard input is
REPORT = """
import os, sys
print(os.getpgrp() == os.getpid(), os.path.realpath("/proc/self/fd/0"))
"""


def test_it_runs_in_its_own_group_with_dev_null_as_input(tmp_path: Path) -> None:
    out = tmp_path / "out"
    child = spawn([sys.executable, "-c", f"import sys; sys.stdout = open({str(out)!r}, 'w')\n"
                   + REPORT], dict(os.environ))
    assert child.wait() == 0 and child.poll() == 0
    assert out.read_text().split() == ["True", "/dev/null"]


def test_the_program_is_looked_up_in_its_own_environments_path(tmp_path: Path) -> None:
    """As subprocess does: the PATH the engine gets, not the supervisor's."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    tool = bin_dir / "only-here"
    mark = tmp_path / "ran"
    tool.write_text(f"#!/bin/sh\n: > {mark}\n")
    tool.chmod(0o755)
    child = spawn(["only-here"], {"PATH": f"/nonexistent:{bin_dir}"})
    assert child.wait() == 0 and mark.exists()


def test_sigpipe_is_back_to_its_default_action(tmp_path: Path) -> None:
    """Python ignores SIGPIPE; an engine writing to a closed pipe must die of it, as
    subprocess's restore_signals makes it."""
    assert signal.getsignal(signal.SIGPIPE) == signal.SIG_IGN   # this test's own Python
    out = tmp_path / "traps"
    child = spawn(["/bin/sh", "-c", f"trap > {out}"], {"PATH": os.defpath})
    assert child.wait() == 0
    assert "PIPE" not in out.read_text()   # nothing ignored: a shell lists ignored traps


def test_a_program_that_cannot_run_is_an_oserror_in_the_parent(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        spawn([str(tmp_path / "missing")], {})
    with pytest.raises(FileNotFoundError):
        spawn(["no-such-engine-anywhere"], {"PATH": str(tmp_path)})
    plain = tmp_path / "not-executable"
    plain.write_text("#!/bin/sh\n")
    with pytest.raises(PermissionError):
        spawn([str(plain)], {})


def test_a_signal_reaches_it_and_its_status_says_so() -> None:
    child = spawn(["/bin/sleep", "30"], {})
    assert child.poll() is None
    child.send_signal(signal.SIGTERM)
    assert child.wait() == -signal.SIGTERM
    child.send_signal(signal.SIGTERM)   # reaped: nothing is signalled any more
