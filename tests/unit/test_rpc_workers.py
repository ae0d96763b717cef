"""One model across hosts with llama.cpp's RPC backend (issue 30, item 2), with the real
``ggml-rpc-server`` (built beside llama-server with GGML_RPC=ON by the set-up) and the
real engine, on loopback: the worker started by ``lokid rpc-worker`` from its config;
``lokid plan`` showing its device and free memory; the engine step checking it answers
before the attempt token moves (exit 75 naming it when it does not), then serving with
its layers on the worker; and a worker killed mid-serve failing the engine with the
worker named."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from support.enginekit import free_port
from test_unit import Dirs, EngineHelper, run_helper

from lokid.core.fleet.worker import parse_worker, worker_argv, worker_dropin
from lokid.host.rpcprobe import probe
from lokid.store.state import StateDB
from lokid.unit.workers import EXIT_WORKERS

pytestmark = [pytest.mark.engine, pytest.mark.slow]


@pytest.fixture
def dirs(tmp_path: Path, engine: str, models: Any) -> Dirs:
    assert Path(models.llama).name == "llama.gguf"
    return Dirs(tmp_path, engine, models)


class Worker:
    """``lokid rpc-worker NAME`` on loopback, as loki-rpc@NAME.service runs it."""

    def __init__(self, dirs: Dirs, tmp_path: Path, name: str = "w1"):
        self.port = free_port()
        self.endpoint = f"127.0.0.1:{self.port}"
        rpc = dirs.config / "rpc"
        rpc.mkdir(exist_ok=True)
        (rpc / f"{name}.toml").write_text(f'listen = "{self.endpoint}"\nthreads = 1\n')
        self.log = tmp_path / f"{name}.log"
        with open(self.log, "wb") as out:
            self.proc = subprocess.Popen([sys.executable, "-m", "lokid.cli", "rpc-worker", name],
                                         env=dirs.env(), stdout=out, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 30
        while probe(self.endpoint, timeout=1).problem:
            assert self.proc.poll() is None and time.monotonic() < deadline, \
                self.log.read_text()
            time.sleep(0.1)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(10)


@pytest.fixture
def worker(dirs: Dirs, tmp_path: Path) -> Iterator[Worker]:
    w = Worker(dirs, tmp_path)
    yield w
    w.kill()


def test_rpc_worker_execs_the_real_server_from_its_config(worker: Worker) -> None:
    # no interpreter left beside it: the process is ggml-rpc-server itself
    exe = os.readlink(f"/proc/{worker.proc.pid}/exe")
    assert exe.endswith("/ggml-rpc-server"), exe
    cmdline = Path(f"/proc/{worker.proc.pid}/cmdline").read_bytes().split(b"\0")
    assert [a.decode() for a in cmdline[1:5]] == ["--host", "127.0.0.1", "--port",
                                                  str(worker.port)]
    view = probe(worker.endpoint)
    assert view.version == "7.0.0" and len(view.devices) == 1
    free, total = view.devices[0]
    assert 0 < free <= total


def test_a_worker_config_that_cannot_be_used_is_one_line_and_78(
        dirs: Dirs, tmp_path: Path) -> None:
    rpc = dirs.config / "rpc"
    rpc.mkdir()
    (rpc / "open.toml").write_text('listen = "0.0.0.0:50052"\n')
    r, _ = run_helper(dirs, tmp_path, "rpc-worker", "open")
    assert r.returncode == 78 and "listens on every address" in r.stderr, r.stderr
    (rpc / "far.toml").write_text('listen = "192.0.2.7:50052"\n')
    r, _ = run_helper(dirs, tmp_path, "rpc-worker", "far")
    assert r.returncode == 78 and "heads: missing" in r.stderr, r.stderr
    assert "Traceback" not in r.stderr


def test_the_worker_units_dropin_allows_its_heads_only() -> None:
    w = parse_worker('listen = "10.0.0.2:50052"\nheads = ["10.0.0.1", "10.1.0.0/16"]\n'
                     'devices = ["CUDA0", "CUDA1"]\ncache = true\n', "/etc/loki/rpc/gpu.toml",
                     "gpu")
    assert "IPAddressAllow=10.0.0.1 10.1.0.0/16\n" in worker_dropin(w)
    assert worker_argv(w, "/opt/b/ggml-rpc-server") == [
        "/opt/b/ggml-rpc-server", "--host", "10.0.0.2", "--port", "50052", "--device",
        "CUDA0,CUDA1", "--cache"]


def test_plan_shows_the_workers_devices_and_the_engine_serves_through_it(
        dirs: Dirs, worker: Worker, tmp_path: Path) -> None:
    dirs.preset("split", f'model = "llama.gguf"\nrpc = ["{worker.endpoint}"]\n')
    r = subprocess.run([sys.executable, "-m", "lokid.cli", "plan", "split"],
                       env=dirs.env(), capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert f"--rpc {worker.endpoint}" in r.stdout
    assert f"RPC workers:\n  {worker.endpoint}: 1 device: #0 " in r.stdout, r.stdout
    assert "(RPC 7.0.0)" in r.stdout
    r = subprocess.run([sys.executable, "-m", "lokid.cli", "plan", "split", "--json"],
                       env=dirs.env(), capture_output=True, text=True, timeout=120)
    [shown] = json.loads(r.stdout)["rpc_workers"]
    assert shown["endpoint"] == worker.endpoint and shown["problem"] == ""
    h = EngineHelper(dirs, "split", tmp_path, INVOCATION_ID="inv-1")
    try:
        h.notify.wait_for("READY=1")
        answer = httpx.post(f"http://127.0.0.1:{dirs.port}/v1/chat/completions", json={
            "messages": [{"role": "user", "content": "Hello"}], "max_tokens": 4}, timeout=60)
        assert answer.status_code == 200, answer.text
        assert "Accepted client connection" in worker.log.read_text()
        # the worker serves one client at a time: held by this engine, it is busy
        assert probe(worker.endpoint, timeout=1).busy
        # killed mid-serve: the engine fails (not a clean exit), the worker named
        worker.kill()
        try:
            httpx.post(f"http://127.0.0.1:{dirs.port}/v1/chat/completions", json={
                "messages": [{"role": "user", "content": "Hello"}], "max_tokens": 4},
                timeout=30)
        except httpx.HTTPError:
            pass   # the engine went away while answering
        rc = h.proc.wait(60)
    finally:
        if h.proc.poll() is None:
            h.proc.send_signal(signal.SIGTERM)
        h.stop()
    said = h.log.read_text()
    assert rc not in (0, 78), (rc, said[-3000:])
    assert f"RPC worker {worker.endpoint}: cannot connect (Connection refused)" in said, \
        said[-3000:]
    status = [m for m in h.notify.messages if m.startswith("STATUS=")]
    assert worker.endpoint in status[-1], status


def test_a_start_whose_worker_is_down_is_refused_before_the_token_naming_it(
        dirs: Dirs, tmp_path: Path) -> None:
    down = f"127.0.0.1:{free_port()}"
    dirs.preset("split", f'model = "llama.gguf"\nrpc = ["{down}"]\n[spec]\nmode = "auto"\n')
    r, _ = run_helper(dirs, tmp_path, "prestart", "split", INVOCATION_ID="inv-2")
    assert r.returncode == 0, r.stderr   # the refusal is handed to the engine step
    r, messages = run_helper(dirs, tmp_path, "engine", "split", INVOCATION_ID="inv-2")
    assert r.returncode == EXIT_WORKERS, (r.returncode, r.stderr)
    status = [m for m in messages if m.startswith("STATUS=")]
    assert f"RPC worker {down}: cannot connect (Connection refused)" in status[-1], status
    # no attempt token was set: a worker down is no failed launch of this configuration
    with StateDB(dirs.state) as db:
        assert db.attempt("split") is None


def test_a_model_split_over_a_worker_answers_as_on_one_host(
        dirs: Dirs, worker: Worker, tmp_path: Path, engine: str, models: Any) -> None:
    """The real llama-server with every layer on the worker (-ngl 99 --rpc), and the same
    engine alone: with a fixed seed and greedy sampling, the same tokens."""
    from support.enginekit import running as engine_running

    body = {"prompt": "The capital of France is", "n_predict": 24, "temperature": 0,
            "seed": 7, "cache_prompt": False}
    answers = []

    def accepted() -> int:
        return worker.log.read_text().count("Accepted client connection")

    for extra in ([], ["-ngl", "99", "--rpc", worker.endpoint]):
        before = accepted()
        port = free_port()
        with engine_running([engine, "-m", models.llama, "--host", "127.0.0.1", "--port",
                             str(port), "-c", "512", *extra],
                            tmp_path / f"engine-{len(answers)}.log"):
            r = httpx.post(f"http://127.0.0.1:{port}/completion", json=body, timeout=60)
            assert r.status_code == 200, r.text
            answers.append(r.json()["content"])
        # the engine alone never reached the worker; the split one did
        assert (accepted() > before) == bool(extra)
    assert answers[0] and answers[0] == answers[1], answers


def test_a_preset_split_with_workers_is_not_refused_by_this_hosts_room(
        dirs: Dirs, worker: Worker) -> None:
    """The estimate counts every layer on this host; with --rpc some go to the workers:
    lokid plan refuses the preset alone (it needs more than the host's bounded room,
    10 MiB) and not the one split with a worker."""
    toml = dirs.config / "lokid.toml"
    toml.write_text(toml.read_text() + '[placement]\nhost_memory = "10M"\n')

    def plan(name: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "lokid.cli", "plan", name],
                              env=dirs.env(), capture_output=True, text=True, timeout=120)

    dirs.preset("alone", 'model = "llama.gguf"\n')   # about 29 MiB, over the room
    r = plan("alone")
    assert r.returncode == 2 and "does not fit" not in r.stdout, (r.stdout, r.stderr)
    assert "needs" in r.stderr, r.stderr
    (dirs.config / "presets" / "alone.toml").unlink()   # its port is the next one's
    dirs.preset("split", f'model = "llama.gguf"\nrpc = ["{worker.endpoint}"]\n')
    r = plan("split")
    assert r.returncode == 0, r.stderr
    assert "RPC workers:" in r.stdout
