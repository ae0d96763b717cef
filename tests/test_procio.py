"""Finding the engine behind a port and reading its disk reads (the thrash hint), for real."""

from __future__ import annotations

import socket
import subprocess
import sys
import time

from lokid import procio


def test_the_process_listening_on_a_port_and_its_io() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = subprocess.Popen([sys.executable, "-m", "http.server", str(port), "--bind",
                               "127.0.0.1"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 10
        while procio.pid_listening_on(port) is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert procio.pid_listening_on(port) == server.pid
        sample = procio.io_sample(server.pid)
        assert sample is not None and sample[0] >= 0 and sample[1] > 1 << 20
        sampler = procio.sampler_for_port(port)
        assert sampler is not None and sampler() is not None
    finally:
        server.terminate()
        server.wait(10)
    assert procio.pid_listening_on(port) is None
    assert procio.sampler_for_port(port) is None
    assert procio.io_sample(2**22 + 7) is None
