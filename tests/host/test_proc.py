"""Finding the engine behind a port and reading its disk reads (the thrash hint), for real."""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from lokid.host import proc


def test_the_process_listening_on_a_port_and_its_io() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = subprocess.Popen([sys.executable, "-m", "http.server", str(port), "--bind",
                               "127.0.0.1"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 10
        while proc.pid_listening_on(port) is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert proc.pid_listening_on(port) == server.pid
        sample = proc.io_sample(server.pid)
        assert sample is not None and sample.read_bytes >= 0
        assert sample.memory_bytes is not None and sample.memory_bytes > 1 << 20
        assert sample.memory == "engine RSS"
        sampler = proc.sampler_for_port(port)
        assert sampler is not None and asyncio.run(sampler()) is not None
        assert server.pid in proc.children(os.getpid())
        assert proc.listening(port)
        assert proc.cmdline(server.pid) == [sys.executable, "-m", "http.server", str(port),
                                              "--bind", "127.0.0.1"]
    finally:
        server.terminate()
        server.wait(10)
    assert proc.pid_listening_on(port) is None and not proc.listening(port)
    assert proc.sampler_for_port(port) is None and proc.cmdline(server.pid) is None
    assert proc.io_sample(2**22 + 7) is None


def test_children_without_the_kernel_lists(monkeypatch: pytest.MonkeyPatch) -> None:
    # a kernel without CONFIG_PROC_CHILDREN: the parents in /proc/<pid>/stat instead
    child = subprocess.Popen(["sleep", "30"])
    real_open = open

    def no_children(path: str, *args: Any, **kw: Any) -> Any:
        if str(path).endswith("/children"):
            raise FileNotFoundError(path)
        return real_open(path, *args, **kw)

    try:
        monkeypatch.setattr("builtins.open", no_children)
        assert child.pid in proc.children(os.getpid())
    finally:
        monkeypatch.undo()
        child.kill()
        child.wait()
    assert proc.children(2**22 + 7) == []


def test_the_live_members_of_a_process_group() -> None:
    leader = subprocess.Popen(["/bin/sh", "-c", "sleep 30 & sleep 30 & wait"], process_group=0)
    try:
        deadline = time.monotonic() + 10
        while len(proc.group_members(leader.pid)) < 3 and time.monotonic() < deadline:
            time.sleep(0.01)
        members = proc.group_members(leader.pid)
        assert leader.pid in members and len(members) == 3
        assert os.getpid() not in members
    finally:
        os.killpg(leader.pid, 9)
        leader.wait()
    deadline = time.monotonic() + 10
    while proc.group_members(leader.pid) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert proc.group_members(leader.pid) == []  # zombies (the sleeps, now init's) left out


def test_the_process_listening_on_a_unix_socket(tmp_path: Path) -> None:
    """An on-demand preset's engine under systemd: its port is systemd's, and the engine
    is found by the UNIX socket it listens on (the thrash hint of `lokid bench --full`)."""
    path = str(tmp_path / "engine.sock")
    script = ("import socket, sys, time\ns = socket.socket(socket.AF_UNIX)\n"
              "s.bind(sys.argv[1]); s.listen(); print('up', flush=True); time.sleep(60)\n")
    server = subprocess.Popen([sys.executable, "-c", script, path], stdout=subprocess.PIPE)
    try:
        assert server.stdout is not None and server.stdout.readline() == b"up\n"
        assert proc.pid_listening_at(path) == server.pid
        sampler = proc.sampler_for_port(1, path)   # the port is ignored: systemd holds it
        assert sampler is not None and asyncio.run(sampler()) is not None
        # a client's socket connected there is not a listener
        with socket.socket(socket.AF_UNIX) as client:
            client.connect(path)
            assert proc.pid_listening_at(path) == server.pid
    finally:
        server.terminate()
        server.wait(10)
    assert proc.pid_listening_at(path) is None
    assert proc.pid_listening_at(str(tmp_path / "none.sock")) is None
