"""The daemon's local runner: an engine step dies with its daemon (real processes).

``lokid engine`` sets its own PR_SET_PDEATHSIG when the local runner spawns it (the
runner's spawn has no preexec_fn, so the daemon's fork is a vfork): a daemon killed with
SIGKILL leaves no engine step, no engine and no spare step behind."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

from support.daemonproc import daemon_process
from support.enginekit import alive, free_port, tiny_config

from lokid.core.names import BUS_NAME, MANAGER_INTERFACE, OBJECT_PATH
from lokid.host.proc import children
from lokid.planning.endpoint import health_status
from lokid.unit.supervisor import PARENT_PID


def test_an_engine_step_and_its_engine_die_with_a_killed_daemon(tmp_path: Path) -> None:
    port = free_port()
    config = tiny_config(tmp_path, "tiny", f"port = {port}\n")
    with daemon_process(config, tmp_path) as daemon:
        r = subprocess.run(["busctl", f"--address={daemon.address}", "call", BUS_NAME,
                            OBJECT_PATH, MANAGER_INTERFACE, "StartPreset", "s", "tiny"],
                           capture_output=True, text=True, timeout=30)
        assert r.returncode == 0, r.stderr
        deadline = time.monotonic() + 120
        while health_status("127.0.0.1", port, 1.0) != 200:
            assert time.monotonic() < deadline, "the engine did not answer in 120 s"
            time.sleep(0.1)
        # the step that runs the engine, and the spare started once it was ready
        spare_deadline = time.monotonic() + 30
        while len(children(daemon.proc.pid)) < 2:
            assert time.monotonic() < spare_deadline, "no spare step in 30 s"
            time.sleep(0.05)
        (step,) = [p for p in children(daemon.proc.pid) if children(p)]
        (spare,) = [p for p in children(daemon.proc.pid) if p != step]
        environ = Path(f"/proc/{step}/environ").read_bytes().split(b"\0")
        # the premise: the step was told its parent (and guards itself)
        assert f"{PARENT_PID}={daemon.proc.pid}".encode() in environ
        engines = children(step)
        assert engines and all(alive(p) for p in engines)
        os.kill(daemon.proc.pid, signal.SIGKILL)
        daemon.proc.wait(10)
        deadline = time.monotonic() + 60
        while any(alive(p) for p in (step, spare, *engines)):
            assert time.monotonic() < deadline, "left behind: " + ", ".join(
                str(p) for p in (step, spare, *engines) if alive(p))
            time.sleep(0.1)
    assert health_status("127.0.0.1", port, 1.0) is None   # nothing answers there any more
