"""lokictl against the real daemon on a private real dbus-daemon."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from enginekit import NotifyListener, write_config, write_preset

pytestmark = pytest.mark.engine


@pytest.fixture
def daemon(tmp_path: Path, engine: str, models: Any, bus_address: str) -> Iterator[str]:
    config = write_config(tmp_path, engine, [models.dir])
    write_preset(config, "tiny", f'model = "{Path(models.llama).name}"\nctx = 2048\n'
                 '[spec]\nmode = "ngram"\n')
    write_preset(config, "broken", 'model = "llama.gguf"\nctx = "big"\n')
    notify = NotifyListener(tmp_path / "notify")
    env = {**os.environ, "LOKI_STATE_DIR": str(tmp_path / "state"),
           "LOKI_RUNTIME_DIR": str(tmp_path / "run"), "NOTIFY_SOCKET": notify.path}
    proc = subprocess.Popen([sys.executable, "-m", "lokid.cli", "--config-dir", str(config),
                             "daemon", "--bus", "session", "--bus-address", bus_address],
                            env=env, stderr=subprocess.DEVNULL)
    try:
        notify.wait_for("READY=1", timeout=60)
        yield bus_address
    finally:
        proc.terminate()
        proc.wait(30)
        notify.close()


def lokictl(address: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "lokid.ctl", "--address", address, *args],
                          capture_output=True, text=True, timeout=60)


def test_status(daemon: str) -> None:
    r = lokictl(daemon, "status")
    assert r.returncode == 0, r.stderr
    assert "1 presets, 1 broken" in r.stdout and "broken broken:" in r.stdout
    data = json.loads(lokictl(daemon, "status", "--json").stdout)
    assert data["presets"] == ["tiny"] and list(data["broken"]) == ["broken"]


def test_presets_and_show(daemon: str) -> None:
    r = lokictl(daemon, "presets")
    assert r.returncode == 0 and "tiny" in r.stdout and "ngram" in r.stdout, r.stderr
    rows = json.loads(lokictl(daemon, "presets", "--json").stdout)
    assert [row["Name"] for row in rows] == ["tiny"]
    show = json.loads(lokictl(daemon, "show", "tiny", "--json").stdout)
    assert show["Unit"] == "loki-engine@tiny.service" and "ngram-mod" in show["Argv"]


def test_plan_matches_lokid_plan_json(daemon: str, tmp_path: Path) -> None:
    r = lokictl(daemon, "plan", "tiny", "--json")
    assert r.returncode == 0, r.stderr
    over_bus = json.loads(r.stdout)
    local = json.loads(subprocess.run(
        [sys.executable, "-m", "lokid.cli", "--config-dir", str(tmp_path / "config"), "plan",
         "tiny", "--json"], capture_output=True, text=True,
        env={**os.environ, "LOKI_STATE_DIR": str(tmp_path / "state")}).stdout)
    assert over_bus == local


@pytest.mark.parametrize("args,code,fragment", [
    (("show", "nope"), 4, "no preset 'nope'"),
    (("plan", "broken"), 2, "ctx: must be an integer"),
    (("frobnicate",), 2, "invalid choice"),
])
def test_exit_codes(daemon: str, args: tuple[str, ...], code: int, fragment: str) -> None:
    r = lokictl(daemon, *args)
    assert r.returncode == code, (r.stdout, r.stderr)
    assert fragment in r.stderr and "Traceback" not in r.stderr


def test_no_daemon_is_a_clear_error(bus_address: str) -> None:
    r = lokictl(bus_address, "status")
    assert r.returncode == 1 and "lokid is not running" in r.stderr, r.stderr
