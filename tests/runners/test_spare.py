"""The local runner's spare engine step (lokid.runners.spare, lokid.unit.standby): real
daemon, real bus, real engine.

A ``lokid engine -`` is started ahead; a start hands it the preset instead of waiting
for a new interpreter, and a new spare follows once that start is done. A spare that is
gone is not used, and ``lokid engine -`` outside the local runner is a refused name."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from support import REPO
from support.daemonproc import daemon_process
from support.enginekit import free_port, tiny_config

from lokid.core.launch.crashloop import EXIT_CONFIG
from lokid.core.names import BUS_NAME, MANAGER_INTERFACE, OBJECT_PATH
from lokid.host.proc import children
from lokid.planning.endpoint import health_status
from lokid.unit.supervisor import PARENT_PID


def cmdline(pid: int) -> list[bytes]:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[:-1]
    except OSError:
        return []


def spares(daemon: int) -> list[int]:
    """The daemon's children waiting as ``lokid engine -`` (no engine under them)."""
    return [p for p in children(daemon)
            if cmdline(p)[-2:] == [b"engine", b"-"] and not children(p)]


def until(what: str, check, timeout: float = 30.0):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while True:
        found = check()
        if found:
            return found
        assert time.monotonic() < deadline, f"{what}: not within {timeout:.0f} s"
        time.sleep(0.05)


def start(address: str, preset: str) -> None:
    r = subprocess.run(["busctl", f"--address={address}", "call", BUS_NAME, OBJECT_PATH,
                        MANAGER_INTERFACE, "StartPreset", "s", preset],
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, r.stderr


def test_a_start_takes_the_spare_step_and_another_one_follows(tmp_path: Path) -> None:
    port = free_port()
    config = tiny_config(tmp_path, "tiny", f"port = {port}\n")
    with daemon_process(config, tmp_path) as daemon:
        (spare,) = until("a spare step", lambda: spares(daemon.proc.pid))
        start(daemon.address, "tiny")
        until("the engine's answer", lambda: health_status("127.0.0.1", port, 1.0) == 200,
              120)
        # the step that runs the engine is the spare started before the start was asked
        steps = [p for p in children(daemon.proc.pid) if children(p)]
        assert steps == [spare]
        (engine,) = children(spare)
        assert b"--port" in cmdline(engine) and str(port).encode() in cmdline(engine)
        # and the next start has one waiting again
        (fresh,) = until("a new spare", lambda: spares(daemon.proc.pid))
        assert fresh != spare


def test_a_spare_killed_by_hand_is_not_used(tmp_path: Path) -> None:
    port = free_port()
    config = tiny_config(tmp_path, "tiny", f"port = {port}\n")
    with daemon_process(config, tmp_path) as daemon:
        (spare,) = until("a spare step", lambda: spares(daemon.proc.pid))
        os.kill(spare, signal.SIGKILL)
        start(daemon.address, "tiny")
        until("the engine's answer", lambda: health_status("127.0.0.1", port, 1.0) == 200,
              120)
        (step,) = [p for p in children(daemon.proc.pid) if children(p)]
        assert step != spare
        assert cmdline(step)[-2:] == [b"engine", b"tiny"]   # a step of its own


def run_standby(tmp_path: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if k not in (PARENT_PID, "INVOCATION_ID")}
    return subprocess.run(
        [sys.executable, "-m", "lokid", "engine", "-"], stdin=subprocess.DEVNULL,
        capture_output=True, text=True, timeout=60,
        env={**base, "PYTHONPATH": str(REPO), "LOKI_CONFIG_DIR": str(tmp_path / "config"),
             "LOKI_STATE_DIR": str(tmp_path / "state"),
             "LOKI_RUNTIME_DIR": str(tmp_path / "run"), **env})


def test_a_spare_whose_input_ends_exits_quietly(tmp_path: Path) -> None:
    r = run_standby(tmp_path, {PARENT_PID: str(os.getpid())})
    assert (r.returncode, r.stdout, r.stderr) == (0, "", "")
    assert not (tmp_path / "run").exists()   # nothing started, nothing written


def test_engine_dash_outside_the_local_runner_is_a_refused_name(tmp_path: Path) -> None:
    r = run_standby(tmp_path, {})
    assert r.returncode == EXIT_CONFIG
    assert "'-'" in r.stderr or '"-"' in r.stderr, r.stderr
