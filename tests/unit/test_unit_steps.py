"""The unit's two start steps apart, outside systemd, with the real engine and a real
sd_notify socket: ``lokid prestart`` (ExecStartPre=) plans and hands over, ``lokid engine``
(ExecStart=) runs what it was handed; a refusal goes from the first to the second, a
SIGTERM while planning is a clean end, and an engine that refuses its own command line
ends the start as a config error does (78), where a crash does not."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from support.enginekit import NotifyListener
from test_unit import AUTO, Dirs, EngineHelper, run_helper

from lokid.store.runtimedir import read_runtime_plan
from lokid.store.state import StateDB

pytestmark = pytest.mark.engine


@pytest.fixture
def dirs(tmp_path: Path, engine: str, models: Any) -> Dirs:
    return Dirs(tmp_path, engine, models)


def test_the_engine_step_runs_what_the_prestart_step_planned(
        dirs: Dirs, models: Any, tmp_path: Path) -> None:
    dirs.preset("p", f'model = "{models.mtp_full}"\n{AUTO}')
    r, _ = run_helper(dirs, tmp_path, "prestart", "p", INVOCATION_ID="inv-1")
    assert r.returncode == 0, r.stderr
    planned = read_runtime_plan(dirs.runtime, "p", "inv-1")
    assert planned.auto and "--spec-type" in planned.argv
    # An edit after planning is for the next start: this one runs what was planned
    # (and whose token was set), not a plan of its own.
    dirs.preset("p", f'model = "{models.mtp_full}"\n')
    h = EngineHelper(dirs, "p", tmp_path, INVOCATION_ID="inv-1")
    try:
        h.notify.wait_for("READY=1")
        ran = read_runtime_plan(dirs.runtime, "p", "inv-1")
        assert ran.argv == planned.argv and ran.pid == h.proc.pid  # the supervisor's pid
        assert "--spec-type" in Path(f"/proc/{h.engine_pid()}/cmdline").read_text()
    finally:
        assert h.stop() == 0


def test_a_restart_reuses_the_plan_across_the_two_steps(
        dirs: Dirs, models: Any, tmp_path: Path) -> None:
    dirs.preset("p", f'model = "{models.llama}"\n')
    time.sleep(1.1)  # a plan is kept for reuse once its files are a second old
    for n, how in enumerate(["plan: ", "plan (the last ready start's"]):
        r, _ = run_helper(dirs, tmp_path, "prestart", "p", INVOCATION_ID=f"inv-{n}")
        assert r.returncode == 0, r.stderr
        h = EngineHelper(dirs, "p", tmp_path, INVOCATION_ID=f"inv-{n}")
        try:
            h.notify.wait_for("READY=1")
            deadline = time.monotonic() + 10
            while not Path(dirs.runtime, "p.reuse").exists() and time.monotonic() < deadline:
                time.sleep(0.05)
        finally:
            assert h.stop() == 0
        assert how in h.log.read_text(), h.log.read_text()
        assert Path(dirs.runtime, "p.reuse").exists()


def test_a_refusal_is_left_to_the_engine_step(dirs: Dirs, tmp_path: Path) -> None:
    """RestartPreventExitStatus= reads the main process's status only, and only its STATUS=
    is shown (NotifyAccess=main): the prestart step exits 0 and the engine step says why."""
    dirs.preset("p", 'model = "missing.gguf"\n')
    r, messages = run_helper(dirs, tmp_path, "prestart", "p", INVOCATION_ID="inv-1")
    assert r.returncode == 0, r.stderr
    assert "missing.gguf" in r.stderr and "Traceback" not in r.stderr
    assert not [m for m in messages if m.startswith("STATUS=")]
    r, messages = run_helper(dirs, tmp_path, "engine", "p", INVOCATION_ID="inv-1")
    assert r.returncode == 78, r.stderr
    status = [m for m in messages if m.startswith("STATUS=")]
    assert len(status) == 1 and "missing.gguf" in status[0], messages
    assert r.stderr == ""  # logged once, by the step that found it
    # another start's engine step is not refused by this start's record
    r, messages = run_helper(dirs, tmp_path, "engine", "p", INVOCATION_ID="inv-2")
    assert r.returncode == 78 and "missing.gguf" in r.stderr  # it planned itself
    # by hand (no INVOCATION_ID), prestart is a command like any other: exit 2
    r, _ = run_helper(dirs, tmp_path, "prestart", "p")
    assert r.returncode == 2 and "missing.gguf" in r.stderr


def test_the_crash_loop_refusal_goes_through_the_engine_step(dirs: Dirs, models: Any,
                                                             tmp_path: Path) -> None:
    dirs.preset("p", f'model = "{models.llama}"\n')
    for n in range(5):
        run_helper(dirs, tmp_path, "stopped", "p", INVOCATION_ID=f"i{n}",
                   SERVICE_RESULT="exit-code", EXIT_CODE="exited", EXIT_STATUS="1")
    r, _ = run_helper(dirs, tmp_path, "prestart", "p", INVOCATION_ID="i6")
    assert r.returncode == 0 and "5 failures in 10 min" in r.stderr, r.stderr
    assert not Path(dirs.runtime, "p.json").exists()  # refused before planning
    r, messages = run_helper(dirs, tmp_path, "engine", "p", INVOCATION_ID="i6")
    assert r.returncode == 69, r.stderr
    assert "5 failures in 10 min" in [m for m in messages if m.startswith("STATUS=")][-1]


HANG = "sleep 61.25"
HANGS_ON_HELP = """#!/bin/sh
for arg in "$@"; do
    case "$arg" in --help) exec {hang} ;; esac
done
exec {engine} "$@"
"""


def _pgrep(pattern: str) -> str:
    return subprocess.run(["pgrep", "-f", pattern], capture_output=True, text=True).stdout.strip()


def test_a_sigterm_while_planning_ends_the_prestart_step_cleanly(
        dirs: Dirs, models: Any, tmp_path: Path, engine: str) -> None:
    """systemd takes a control process killed by its SIGTERM for a failure (Result=signal):
    a stop or restart while a start plans left the unit failed."""
    wrapper = tmp_path / "hangs-on-help"
    wrapper.write_text(HANGS_ON_HELP.format(engine=engine, hang=HANG))
    wrapper.chmod(0o755)
    (dirs.config / "lokid.toml").write_text(f'engine = "{wrapper}"\n'
                                            f'model_dirs = ["{models.dir}"]\n')
    dirs.preset("p", f'model = "{models.mtp_full}"\n{AUTO}')
    notify = NotifyListener(tmp_path / "notify")
    proc = subprocess.Popen([sys.executable, "-m", "lokid.cli", "prestart", "p"],
                            env=dirs.env(NOTIFY_SOCKET=notify.path, INVOCATION_ID="inv-1"),
                            stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 30
        while not _pgrep(HANG):
            assert time.monotonic() < deadline and proc.poll() is None
            time.sleep(0.05)
        t0 = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        rc = proc.wait(10)
        took = time.monotonic() - t0
    finally:
        notify.close()
        if proc.poll() is None:
            proc.kill()
    assert proc.stderr is not None
    err = proc.stderr.read()
    assert rc == 0 and took < 2, (rc, took, err)
    assert "stopped while planning" in err and "Traceback" not in err, err
    assert not Path(dirs.runtime, "p.prestart").exists()  # nothing handed to an engine step
    with StateDB(dirs.state) as db:
        assert db.attempt("p") is None  # the stop came before any token
    deadline = time.monotonic() + 5
    while _pgrep(HANG) and time.monotonic() < deadline:  # the probe went with it
        time.sleep(0.05)
    assert not _pgrep(HANG)


def test_an_engine_that_refuses_its_arguments_fails_as_a_config_error(
        dirs: Dirs, models: Any, tmp_path: Path, engine: str) -> None:
    r = subprocess.run([engine, "--no-such-flag"], capture_output=True, text=True,
                       timeout=60)
    line = "error: invalid argument: --no-such-flag"
    assert r.returncode == 1 and line in r.stderr  # the real engine's own words
    dirs.preset("p", f'model = "{models.llama}"\nextra_args = ["--no-such-flag"]\n')
    h = EngineHelper(dirs, "p", tmp_path, INVOCATION_ID="inv-1")
    rc = h.proc.wait(60)
    h.notify.close()
    assert rc == 78, h.log.read_text()
    status = [m for m in h.notify.messages if m.startswith("STATUS=")][-1]
    assert status.startswith("STATUS=llama-server: " + line), status
    assert "restarting cannot help" in status
    assert h.log.read_text().count(line) >= 2  # the engine's own line, and lokid's


CRASHES_WHILE_LOADING = """#!/bin/sh
for arg in "$@"; do
    case "$arg" in --help|--version) exec {engine} "$@" ;; esac
done
echo "error: out of memory while loading (a stand-in for a crash)" >&2
exit 1
"""


def test_a_crash_is_no_argument_error(dirs: Dirs, models: Any, tmp_path: Path,
                                      engine: str) -> None:
    wrapper = tmp_path / "crashes"
    wrapper.write_text(CRASHES_WHILE_LOADING.format(engine=engine))
    wrapper.chmod(0o755)
    (dirs.config / "lokid.toml").write_text(f'engine = "{wrapper}"\n'
                                            f'model_dirs = ["{models.dir}"]\n')
    dirs.preset("p", f'model = "{models.llama}"\n')
    h = EngineHelper(dirs, "p", tmp_path, INVOCATION_ID="inv-1")
    rc = h.proc.wait(60)
    h.notify.close()
    assert rc == 1, h.log.read_text()  # a failure the unit restarts
    assert "refuses its command line" not in h.log.read_text()


def test_the_engine_step_survives_its_package_replaced_while_the_engine_loads(
        dirs: Dirs, models: Any, tmp_path: Path, engine: str) -> None:
    """apt installing another release while a model loads replaces lokid's files under
    the engine step, and a release may move modules (0.2.0 moved them all). What the step
    needs once the engine answers (the token cleared, the ready mark, the plan cache) is
    imported while it loads: here every file of the package is gone by then, and the
    step (after its prestart step, as under systemd: it plans nothing itself) still
    reaches READY and clears its token."""
    import shutil

    import lokid

    pkg = tmp_path / "pkg"
    shutil.copytree(Path(lokid.__file__).parent, pkg / "lokid",
                    ignore=shutil.ignore_patterns("__pycache__"))
    slow = tmp_path / "slow-engine"
    slow.write_text(f'#!/bin/sh\nfor a in "$@"; do case "$a" in --version|--help) exec '
                    f'{engine} "$@";; esac; done\nsleep 2\nexec {engine} "$@"\n')
    slow.chmod(0o755)
    toml = dirs.config / "lokid.toml"
    toml.write_text(toml.read_text().replace(f'"{engine}"', f'"{slow}"'))
    dirs.preset("p", f'model = "{models.mtp_full}"\n{AUTO}')
    where = subprocess.run([sys.executable, "-c", "import lokid; print(lokid.__file__)"],
                           env=dirs.env(PYTHONPATH=str(pkg)), capture_output=True, text=True,
                           cwd=tmp_path)
    assert where.stdout.startswith(str(pkg)), where   # the step runs the copy
    r, _ = run_helper(dirs, tmp_path, "prestart", "p", INVOCATION_ID="inv-1")  # as systemd
    assert r.returncode == 0, r.stderr
    h = EngineHelper(dirs, "p", tmp_path, cwd=tmp_path, INVOCATION_ID="inv-1",
                     PYTHONPATH=str(pkg))
    try:
        deadline = time.monotonic() + 30
        while "plan: " not in h.log.read_text():   # the engine is spawned, and loading
            assert time.monotonic() < deadline and h.proc.poll() is None, h.log.read_text()
            time.sleep(0.02)
        with StateDB(dirs.state) as db:
            assert db.attempt("p") is not None
        shutil.rmtree(pkg / "lokid")   # the other release's files: none of these are left
        h.notify.wait_for("READY=1")
        deadline = time.monotonic() + 10
        while not Path(dirs.runtime, "p.ready").exists():
            assert time.monotonic() < deadline, h.log.read_text()
            time.sleep(0.05)
        with StateDB(dirs.state) as db:
            assert db.attempt("p") is None and db.failures("p") == []
        assert Path(dirs.runtime, "p.ready").read_text() == "inv-1"
        assert "Traceback" not in h.log.read_text(), h.log.read_text()
    finally:
        assert h.stop() == 0
