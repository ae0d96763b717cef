"""lokid.unit.oncpu: the engine step says in the unit's STATUS= what the daemon found,
that its engine runs on the CPU, or ends the start failed with it (issue 44, item 3).

Real processes all through: the real CPU engine (b11434, built with the RPC backend) at
``-lv 4 -ngl 99`` prints "offloaded 3/3 layers to GPU" with CPU buffers only, which is a
real start on the CPU on this machine; its lines are judged by the daemon's rule
(:class:`lokid.core.telemetry.enginelog.LoadTracker`), the note is left by the daemon's own
:class:`lokid.dbus.oncpu.OnCpu`, and ``lokid engine`` reads it under a real sd_notify
socket. The same under systemd with the daemon: tests/dbus/test_daemon_systemd.py."""

from __future__ import annotations

import os
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from test_unit import Dirs, EngineHelper

from lokid.core.telemetry.enginelog import LoadTracker
from lokid.dbus.oncpu import OnCpu
from lokid.planning.endpoint import health_status
from lokid.store.oncpunote import Note, note_path, write_note
from lokid.watch.journalwatch import AutoCut

pytestmark = pytest.mark.engine

ON_CPU = 'extra_args = ["-lv", "4", "-ngl", "99"]\n'


@pytest.fixture
def dirs(tmp_path: Path, engine: str, models: Any) -> Dirs:
    d = Dirs(tmp_path, engine, models)
    d.model = f'model = "{models.llama}"\n'  # type: ignore[attr-defined]
    return d


def _judged(log: Path) -> str:
    """The daemon's rule over what the engine printed: why it runs on the CPU."""
    tracker = LoadTracker()
    for line in log.read_text(errors="replace").splitlines():
        tracker.feed(line)
    load = tracker.current or tracker.before
    return load.on_cpu()


def _tell(dirs: Dirs, preset: str, invocation: str, reason: str, fallback: str) -> None:
    """What the daemon does when its journal watcher finds the start on the CPU."""
    views = {preset: SimpleNamespace(cpu_fallback=fallback)}
    host = SimpleNamespace(registry=SimpleNamespace(presets=views), runtime_dir=dirs.runtime,
                           runner=None)
    OnCpu(host)(AutoCut(preset, invocation, reason))  # type: ignore[arg-type]


def test_the_unit_status_says_the_engine_runs_on_the_cpu(dirs: Dirs, tmp_path: Path) -> None:
    dirs.preset("p", dirs.model + ON_CPU)  # type: ignore[attr-defined]
    os.makedirs(dirs.runtime, exist_ok=True)
    # an earlier start's note (its engine died before it read it): never this start's
    write_note(dirs.runtime, "p", Note("inv-1", True, "an earlier start's GPU"))
    h = EngineHelper(dirs, "p", tmp_path, INVOCATION_ID="inv-2")
    try:
        h.notify.wait_for("READY=1", timeout=60)
        ready = h.notify.wait_for("STATUS=ready: p (")
        reason = _judged(h.log)
        assert reason.startswith("it says offloaded 3/3 layers to GPU"), h.log.read_text()
        time.sleep(2.5)   # the step asked twice meanwhile: the earlier note is not its own
        assert h.proc.poll() is None and os.path.exists(note_path(dirs.runtime, "p"))
        assert [m for m in h.notify.messages if m.startswith("STATUS=")][-1] == ready
        assert not any("CPU" in m for m in h.notify.messages), h.notify.messages
        _tell(dirs, "p", "inv-2", reason, "run")
        said = h.notify.wait_for(f"{ready} — running on the CPU: {reason}", timeout=5)
        assert not os.path.exists(note_path(dirs.runtime, "p"))  # taken
        time.sleep(1.5)   # asked once: the engine serves on, its status kept
        assert h.proc.poll() is None and health_status("127.0.0.1", dirs.port, 2.0) == 200
        assert h.notify.messages[-1] == said or "WATCHDOG" in h.notify.messages[-1]
        assert "the engine runs on the CPU: it says offloaded 3/3" in h.log.read_text()
    finally:
        assert h.stop() == 0


def test_a_preset_that_says_fail_ends_the_start_failed_with_the_reason(
        dirs: Dirs, tmp_path: Path) -> None:
    dirs.preset("p", f'{dirs.model}cpu_fallback = "fail"\n{ON_CPU}')  # type: ignore[attr-defined]
    h = EngineHelper(dirs, "p", tmp_path, INVOCATION_ID="inv-1")
    try:
        h.notify.wait_for("READY=1", timeout=60)
        reason = _judged(h.log)
        _tell(dirs, "p", "inv-1", reason, "fail")
        rc = h.proc.wait(30)
    finally:
        h.stop()
    assert rc == 78, h.log.read_text()[-3000:]   # RestartPreventExitStatus=: not restarted
    status = [m for m in h.notify.messages if m.startswith("STATUS=")]
    assert status[-1] == (f"STATUS=stopped: the engine runs on the CPU: {reason} (the preset "
                          "says cpu_fallback = \"fail\"; a start by hand tries again)"), status
    assert "STOPPING=1" in h.notify.messages
    assert health_status("127.0.0.1", dirs.port, 1.0) != 200
    assert "Traceback" not in h.log.read_text()
