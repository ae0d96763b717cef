"""The `lokid` command as an operator uses it: `plan` and `run`, against the real engine."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from support.enginekit import free_port, write_config, write_preset

pytestmark = pytest.mark.engine


def lokid(config: Path, *args: str, state: Path | None = None,
          **kw: Any) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "LOKI_CONFIG_DIR": str(config),
           "LOKI_STATE_DIR": str(state or config.parent / "state")}
    return subprocess.run([sys.executable, "-m", "lokid.cli", *args], env=env,
                          capture_output=True, text=True, timeout=120, **kw)


@pytest.fixture
def config(tmp_path: Path, engine: str, models: Any) -> Path:
    config = write_config(tmp_path, engine, [models.dir])
    write_preset(config, "demo", f'model = "{Path(models.llama).name}"\nctx = 2048\n'
                 f'port = {free_port()}\n[spec]\nmode = "ngram"\n')
    return config


def test_plan_json_is_the_documented_shape(config: Path, engine: str, models: Any) -> None:
    r = lokid(config, "plan", "demo", "--json")
    assert r.returncode == 0, r.stderr
    data = json.loads(r.stdout)
    assert set(data) == {"preset", "argv", "env", "notes", "spec"}
    assert data["preset"] == "demo"
    assert data["argv"][0] == os.path.realpath(engine)
    assert data["argv"][1:3] == ["-m", models.llama]
    assert data["spec"] == {"mode": "ngram", "types": ["ngram-mod"], "auto": False}
    assert data["env"] == {}


def test_plan_text_shows_command_and_notes(config: Path) -> None:
    write_preset(config, "noted", 'model = "llama.gguf"\n[spec]\nmode = "warp"\n')
    r = lokid(config, "plan", "noted")
    assert r.returncode == 0, r.stderr
    assert "command:\n  " in r.stdout and "-m " in r.stdout
    assert "spec.mode = 'warp' is not valid" in r.stdout


def test_plan_is_read_only(config: Path, tmp_path: Path) -> None:
    state = tmp_path / "state-never-created"
    assert lokid(config, "plan", "demo", state=state).returncode == 0
    assert not state.exists()


@pytest.mark.parametrize("name,text,fragment", [
    ("broken", 'model = "llama.gguf"\nctx = "big"\n', "broken.toml:2: ctx: must be an integer"),
    ("nomodel", 'model = "absent.gguf"\n', "'absent.gguf' is in none of model_dirs"),
    ("corrupt", 'model = "{corrupt}"\n', "not a GGUF file (magic b'GGUX')"),
    ("truncated", 'model = "{truncated}"\n', "truncated"),
    ("bad name!", 'model = "x"\n', "invalid preset name"),
])
def test_plan_errors_exit_2_with_one_clear_line(config: Path, models: Any, name: str,
                                                text: str, fragment: str) -> None:
    text = text.format(corrupt=models.corrupt_magic, truncated=models.truncated)
    if name != "bad name!":
        write_preset(config, name, text)
    r = lokid(config, "plan", name)
    assert r.returncode == 2
    assert fragment in r.stderr
    assert "Traceback" not in r.stderr and r.stdout == ""


def test_plan_of_a_missing_preset(config: Path) -> None:
    r = lokid(config, "plan", "nope")
    assert r.returncode == 2 and "no preset 'nope'" in r.stderr


def test_plan_with_a_missing_engine_says_how_to_fix_it(config: Path, models: Any) -> None:
    (config / "lokid.toml").write_text('engine = "/opt/none/llama-server"\n'
                                       f'model_dirs = ["{models.dir}"]\n')
    r = lokid(config, "plan", "demo")
    assert r.returncode == 2
    assert "engine '/opt/none/llama-server' not found" in r.stderr
    assert str(config / "lokid.toml") in r.stderr


def test_a_broken_preset_does_not_affect_another(config: Path) -> None:
    write_preset(config, "broken", "model = [\n")
    assert lokid(config, "plan", "broken").returncode == 2
    assert lokid(config, "plan", "demo").returncode == 0


# --- lokid run ------------------------------------------------------------------------


class Run:
    """`lokid run` in the background, its stderr collected line by line."""

    def __init__(self, config: Path, preset: str):
        env = {**os.environ, "LOKI_CONFIG_DIR": str(config),
               "LOKI_STATE_DIR": str(config.parent / "state")}
        self.proc = subprocess.Popen([sys.executable, "-m", "lokid.cli", "run", preset],
                                     env=env, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL,
                                     text=True)
        self.lines: list[str] = []
        self.ready = threading.Event()
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.lines.append(line)
            if line.startswith("lokid: ready at "):
                self.ready.set()

    def url(self) -> str:
        for line in self.lines:
            if line.startswith("lokid: ready at "):
                return line.split("ready at ", 1)[1].strip()
        raise AssertionError("".join(self.lines))

    def text(self) -> str:
        return "".join(self.lines)


def port_is_free(port: int) -> bool:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_run_until_ready_then_stop_cleanly(config: Path, sig: int) -> None:
    port = free_port()
    write_preset(config, "r", f'model = "llama.gguf"\nctx = 2048\nport = {port}\n')
    run = Run(config, "r")
    assert run.ready.wait(60), run.text()
    url = run.url()
    assert url == f"http://127.0.0.1:{port}"
    assert "lokid: starting " in run.text()
    assert "load_model: loading model" in run.text()  # the engine's own output streams through
    reply = httpx.post(url + "/v1/chat/completions", timeout=60, json={
        "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8}).json()
    assert reply["timings"]["predicted_n"] > 0
    run.proc.send_signal(sig)
    assert run.proc.wait(60) == 0, run.text()
    assert "lokid: stopping the engine" in run.text()
    assert port_is_free(port)  # no engine left behind


def test_run_refuses_a_busy_port(config: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        write_preset(config, "busy", f'model = "llama.gguf"\nport = {port}\n')
        r = lokid(config, "run", "busy")
    assert r.returncode == 1
    assert f"port {port} on 127.0.0.1 is already in use" in r.stderr


def test_run_exits_with_the_engines_status_when_it_fails(config: Path) -> None:
    write_preset(config, "bad", f'model = "llama.gguf"\nport = {free_port()}\n'
                 'extra_args = ["--spec-type", "warp-drive"]\n')
    started = time.monotonic()
    r = lokid(config, "run", "bad")
    assert r.returncode == 1
    assert "exited with status 1 before it was ready" in r.stderr
    assert 'error while handling argument "--spec-type"' in r.stderr
    assert time.monotonic() - started < 60
