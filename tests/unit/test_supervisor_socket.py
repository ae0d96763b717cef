"""An engine on a UNIX socket (an on-demand preset under systemd, issue 22 item 4): the
supervisor's /health probe and readiness there, and the socket the last engine left
behind cleared before the next start. The real llama-server b11434 and a generated
model: the engine refuses to bind over a stale socket file, which is why lokid clears
it."""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from support.enginekit import free_port

from lokid.core.errors import PortBusyError
from lokid.planning.endpoint import check_listen_free, check_socket_free, health_status
from lokid.unit import supervisor

pytestmark = pytest.mark.engine


def argv(engine: str, model: str, sock: Path) -> list[str]:
    return [engine, "-m", model, "--host", str(sock), "-c", "256"]


def test_the_supervisor_is_ready_when_the_engine_answers_on_its_socket(
        tmp_path: Path, engine: str, models: Any) -> None:
    sock = tmp_path / "lazy.sock"
    port = free_port()   # the public port: nothing listens there in this test
    launch = supervisor.Launch.of("lazy", argv(engine, models.llama, sock), {},
                                  "127.0.0.1", port, str(sock))
    logged: list[str] = []
    seen: list[Any] = []

    def on_ready(url: str) -> None:
        # asked on the socket, not the port: the port has nobody (a relay's unit would
        # wait for this very readiness)
        seen.append((url, health_status("127.0.0.1", port, 1.0, str(sock)),
                     health_status("127.0.0.1", port, 0.5)))
        threading.Timer(0.2, os.kill, (os.getpid(), signal.SIGTERM)).start()

    rc = supervisor.supervise(launch, log=logged.append, on_ready=on_ready)
    assert rc == 0, logged
    # READY's URL is the client's, the preset's port
    assert seen == [(f"http://127.0.0.1:{port}", 200, None)], logged
    assert sock.is_socket()   # what the engine leaves behind: the next start clears it


def test_a_stale_socket_is_cleared_and_a_live_engine_refused(tmp_path: Path, engine: str,
                                                             models: Any) -> None:
    sock = tmp_path / "x.sock"
    first = subprocess.Popen(argv(engine, models.llama, sock), stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while health_status("", 0, 1.0, str(sock)) != 200:
            assert first.poll() is None and time.monotonic() < deadline
            time.sleep(0.05)
        with pytest.raises(PortBusyError, match=f"an engine already listens on {sock}"):
            check_listen_free("127.0.0.1", free_port(), str(sock))
    finally:
        first.terminate()
        first.wait(30)
    assert sock.is_socket()
    # the engine alone does not start over it ...
    refused = subprocess.run(argv(engine, models.llama, sock), capture_output=True,
                             text=True, timeout=60)
    assert refused.returncode != 0 and "couldn't bind HTTP server socket" in refused.stderr
    # ... after the check it does
    check_socket_free(str(sock))
    assert not sock.exists()
    second = subprocess.Popen(argv(engine, models.llama, sock), stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while health_status("", 0, 1.0, str(sock)) != 200:
            assert second.poll() is None and time.monotonic() < deadline
            time.sleep(0.05)
    finally:
        second.terminate()
        second.wait(30)


def test_a_file_in_the_way_is_an_error_not_removed(tmp_path: Path) -> None:
    from lokid.core.errors import ConfigError

    path = tmp_path / "x.sock"
    path.write_text("mine")
    with pytest.raises(ConfigError, match="is in the way of the engine's socket"):
        check_socket_free(str(path))
    assert path.read_text() == "mine"
    check_socket_free(str(tmp_path / "absent.sock"))   # nothing there: free
