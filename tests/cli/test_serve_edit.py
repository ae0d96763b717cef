"""`lokictl set|unset` of a preset's [serve] keys through the real daemon on a private
real dbus-daemon (as tests/cli/test_ctledit.py runs it): the value written as typed, read
back by the plan, a bad span refused with the daemon's located line, the file untouched."""

from __future__ import annotations

import os
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support.daemonproc import daemon_on_bus
from support.enginekit import free_port, write_config, write_preset


@pytest.fixture
def daemon(tmp_path: Path, engine: str, models: Any, bus_address: str) -> Iterator[str]:
    config = write_config(tmp_path, engine, [models.dir])
    assert Path(models.llama).name == "llama.gguf"   # generated on first use
    write_preset(config, "tiny", f'model = "llama.gguf"\nctx = 2048\nport = {free_port()}\n')
    with daemon_on_bus(config, tmp_path, bus_address) as address:
        yield address


def lokictl(address: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "lokid.ctl", "--address", address, *args],
                          capture_output=True, text=True, timeout=60, env=dict(os.environ),
                          stdin=subprocess.DEVNULL)


@pytest.mark.engine
def test_serve_keys_are_set_and_unset_like_every_key(daemon: str, tmp_path: Path) -> None:
    path = tmp_path / "config" / "presets" / "tiny.toml"
    r = lokictl(daemon, "set", "tiny", "serve.idle_stop=15min", "serve.on_demand=true",
                "serve.group=gpu0")
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == ['tiny: serve.idle_stop = "15min" (was not set)',
                                     "tiny: serve.on_demand = true (was not set)",
                                     'tiny: serve.group = "gpu0" (was not set)'], r.stdout
    assert tomllib.loads(path.read_text())["serve"] == {"idle_stop": "15min",
                                                        "on_demand": True, "group": "gpu0"}
    plan = lokictl(daemon, "plan", "tiny")
    assert plan.returncode == 0, plan.stderr
    assert "idle_stop = 15min: stopped after 15min without a request in flight" in plan.stdout
    assert "on_demand = true: started by the gateway's first request for it" in plan.stdout

    before = path.read_bytes()
    r = lokictl(daemon, "set", "tiny", "serve.idle_stop=15 mni")
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert r.stderr.startswith("lokictl: ") and "Traceback" not in r.stderr
    assert "serve.idle_stop" in r.stderr and "unknown time unit 'mni'" in r.stderr, r.stderr
    assert f"{path}:" in r.stderr, r.stderr
    r = lokictl(daemon, "set", "tiny", "serve.ttl=5min")
    assert r.returncode == 2 and "serve.ttl: unknown key" in r.stderr, r.stderr
    assert path.read_bytes() == before

    r = lokictl(daemon, "unset", "tiny", "serve.idle_stop", "serve.on_demand", "serve.group")
    assert r.returncode == 0, r.stderr
    assert "serve" not in tomllib.loads(path.read_text())
    assert "idle_stop" not in lokictl(daemon, "plan", "tiny").stdout
