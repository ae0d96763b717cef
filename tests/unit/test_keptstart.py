"""A restart that nothing changed (lokid.unit.keptstart), outside systemd with the real
engine: the planning step hands the kept plan over without importing json, re, enum or
signal, and the engine step runs it; whatever that path does not decide (a failure on
record, a token noted as cleared, an edit, speculation, another socket, an invocation that
is not systemd's) takes the whole planning step."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from test_unit import AUTO, Dirs, EngineHelper, ready_start, run_helper

from lokid.core.launch.crashloop import Failure
from lokid.core.launch.portunit import HELD_ENV, port_socket
from lokid.store import cleared, exits, plancache
from lokid.store.runtimedir import read_runtime_plan
from lokid.unit import keptstart

pytestmark = pytest.mark.engine

# The planning step as the unit runs it, in a fresh interpreter: its status, then which of
# the modules a kept start must not need it imported.
PROBE = """
import sys
from lokid.cli import main
status = main(["prestart", sys.argv[1]])
heavy = [m for m in ("json", "re", "enum", "signal", "socket", "typing") if m in sys.modules]
print(status, *heavy)
"""


@pytest.fixture
def dirs(tmp_path: Path, engine: str, models: Any) -> Dirs:
    return Dirs(tmp_path, engine, models)


def prestart(dirs: Dirs, invocation: str, **env: str) -> tuple[list[str], dict[str, Any]]:
    """``lokid prestart p`` for ``invocation``: the heavy modules it imported, and what it
    handed over."""
    r = subprocess.run([sys.executable, "-c", PROBE, "p"],
                       env=dirs.env(INVOCATION_ID=invocation, **env),
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
    status, *heavy = r.stdout.split()
    assert status == "0", r.stdout
    handed = json.loads(Path(dirs.runtime, "p.prestart").read_text())
    assert handed["invocation"] == invocation
    return heavy, handed


def test_a_restart_nobody_edited_is_handed_over_without_json_and_runs(
        dirs: Dirs, models: Any, tmp_path: Path) -> None:
    dirs.preset("p", f'model = "{models.llama}"\n')
    time.sleep(1.1)  # a plan is kept only when its files had not changed for a second
    ready_start(dirs, tmp_path)
    invocation = uuid.uuid4().hex   # systemd's form
    heavy, handed = prestart(dirs, invocation)
    assert heavy == [] and handed == {"invocation": invocation, "kept": True}
    h = EngineHelper(dirs, "p", tmp_path, INVOCATION_ID=invocation)
    try:
        h.notify.wait_for("READY=1")
        # the engine step wrote the runtime plan: this start's, naming its supervisor
        plan = read_runtime_plan(dirs.runtime, "p", invocation)
        assert plan.pid == h.proc.pid and plan.port == dirs.port
    finally:
        assert h.stop() == 0
    assert "(the last ready start's: nothing it was made from has changed)" in h.log.read_text()
    # systemd's stop step ends that start (lokid.store.exits.end_start); the start after
    # it again
    r, _ = run_helper(dirs, tmp_path, "stopped", "p", INVOCATION_ID=invocation,
                      SERVICE_RESULT="success", EXIT_CODE="exited", EXIT_STATUS="0")
    assert r.returncode == 0, r.stderr
    assert prestart(dirs, uuid.uuid4().hex)[1]["kept"] is True


def _failure(dirs: Dirs, models: Any) -> dict[str, str]:
    exits.record_failure(dirs.runtime, "p", Failure(time.time(), False, "exit 1"))
    return {}


def _cleared(dirs: Dirs, models: Any) -> dict[str, str]:
    cleared.note_cleared(dirs.runtime, "p", cleared.Token("m", 1.0))
    return {}


def _edited(dirs: Dirs, models: Any) -> dict[str, str]:
    dirs.preset("p", f'model = "{models.llama}"\nubatch = 256\n')
    return {}


def _unended(dirs: Dirs, models: Any) -> dict[str, str]:
    # its stop step killed with the unit's cgroup (`systemctl kill -s KILL`, systemd 257)
    Path(dirs.runtime, "p" + exits.STARTED_SUFFIX).write_text("a-start-before")
    return {}


def _held(dirs: Dirs, models: Any) -> dict[str, str]:
    return {HELD_ENV: port_socket("p")}   # the port now held by systemd: another socket


@pytest.mark.parametrize(("what", "model", "body", "make", "invocation"), [
    ("a failure on record", "llama", "", _failure, ""),
    ("a token noted as cleared", "llama", "", _cleared, ""),
    ("a start before it that its stop step never ended", "llama", "", _unended, ""),
    ("an edited preset", "llama", "", _edited, ""),
    ("the port held by systemd since", "llama", "", _held, ""),
    ("automatic speculation", "mtp_full", AUTO, None, ""),
    ("an invocation that is not systemd's", "llama", "", None, "inv-1"),
])
def test_what_a_kept_start_does_not_decide_takes_the_whole_planning_step(
        dirs: Dirs, models: Any, tmp_path: Path, what: str, model: str, body: str,
        make: Any, invocation: str) -> None:
    dirs.preset("p", f'model = "{getattr(models, model)}"\n{body}')
    time.sleep(1.1)
    ready_start(dirs, tmp_path)
    assert Path(dirs.runtime, "p.reuse").exists()
    env = make(dirs, models) if make else {}
    heavy, handed = prestart(dirs, invocation or uuid.uuid4().hex, **env)
    assert "kept" not in handed and "json" in heavy, (what, handed)


def test_a_kept_plan_of_another_format_plans_afresh(dirs: Dirs, models: Any,
                                                   tmp_path: Path) -> None:
    """A record of the previous format (one JSON document, before an upgrade) is none."""
    dirs.preset("p", f'model = "{models.llama}"\n')
    time.sleep(1.1)
    ready_start(dirs, tmp_path)
    reuse = Path(dirs.runtime, "p.reuse")
    body = reuse.read_text().rsplit("\0", 1)[1]
    reuse.write_text(json.dumps({"format": 1, **json.loads(body)}))
    heavy, handed = prestart(dirs, uuid.uuid4().hex)
    assert "kept" not in handed and handed["planned"]["paths"], handed


def test_a_stop_while_deciding_ends_the_step_cleanly(
        dirs: Dirs, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """SIGTERM (systemd's stop or restart) while the kept plan is checked: the step ends at
    once, cleanly, and hands nothing over; its journal line says so."""
    os.makedirs(dirs.runtime)

    def stopped_while_reading(*_: object) -> None:
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(5)   # the handler runs in here

    monkeypatch.setattr(keptstart.plancache, "kept", stopped_while_reading)
    before = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)
    try:
        assert keptstart.kept_start(dirs.runtime, "p", {"INVOCATION_ID": "ab12"}) is True
        assert (signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)) == before
    finally:
        signal.signal(signal.SIGTERM, before[0])
        signal.signal(signal.SIGINT, before[1])
    assert not Path(dirs.runtime, "p.prestart").exists()
    assert "stopped while planning: a clean stop" in capsys.readouterr().err


def test_without_a_kept_plan_the_handlers_are_back(dirs: Dirs) -> None:
    """Nothing kept: the whole step runs, which installs its own handlers; until then a
    SIGTERM meets the handler there was before, not this path's."""
    before = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)
    assert keptstart.kept_start(dirs.runtime, "p", {"INVOCATION_ID": "ab12"}) is False
    assert (signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)) == before
    assert plancache.kept(dirs.runtime, "p") is None


def test_a_kept_start_whose_port_is_taken_fails_as_any_start_would(
        dirs: Dirs, models: Any, tmp_path: Path) -> None:
    """The port is checked by the engine step, before the spawn: taken, the start ends with
    78 and the holder in its Status, as when the planning step checked it."""
    dirs.preset("p", f'model = "{models.llama}"\n')
    time.sleep(1.1)
    ready_start(dirs, tmp_path)
    invocation = uuid.uuid4().hex
    assert prestart(dirs, invocation)[1]["kept"] is True
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", dirs.port))
        holder.listen()
        r, messages = run_helper(dirs, tmp_path, "engine", "p", INVOCATION_ID=invocation)
    assert r.returncode == 78, r.stderr
    status = [m for m in messages if m.startswith("STATUS=")]
    assert status and f"port {dirs.port} on 127.0.0.1 is already in use" in status[-1], status
