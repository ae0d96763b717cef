"""aiohttp's own log lines in the real gateway process (issue 45, item 6): 2,000 malformed
requests of eight kinds, answered 400 by aiohttp before any route or key, wrote 22,000
lines with their tracebacks (1.5 MB); a client that reset while sending its body was
"the gateway failed" with a traceback. Here ``lokid gateway`` runs as the unit runs it
(its stderr is what journald would get), beside the real daemon on a private bus.

The package runs on Debian's aiohttp (3.8.4, 3.11.16), the venv has 3.14:
tests/packaging/test_deb_hostile.py runs this module in a container of each release on
its own aiohttp; here, set ``LOKID_TEST_AIOHTTP`` to directories holding other versions
(``pip install --target``), separated by ':', and the gateway process runs on each of
them too ("python" is the running interpreter's own aiohttp)."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import struct
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from support.enginekit import free_port, write_config, write_preset

from lokid.gateway.faults import LINES_PER_WINDOW

pytestmark = [pytest.mark.engine, pytest.mark.slow]

# Each a malformed request aiohttp refuses itself (400), of another kind than the others.
MALFORMED = [
    b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\nBad Header sk-secret-in-a-header\r\n\r\n",
    b"GET /" + b"a" * 20000 + b" HTTP/1.1\r\n\r\n",
    b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: abc\r\n\r\n",
    b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nTransfer-Encoding: chunked"
    b"\r\n\r\nzz\r\n",
    b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n",
    b"GET /\x01sk-secret-in-a-line HTTP/1.1\r\n\r\n",
    b"hello there\r\n\r\n",
    b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + bytes(range(40)),
]
EXTRA = [p for p in os.environ.get("LOKID_TEST_AIOHTTP", "").split(":") if p]


@pytest.fixture
def config(tmp_path: Path, engine: str, models: Any) -> Path:
    assert Path(models.llama).name == "llama.gguf"
    config = write_config(tmp_path, engine, [models.dir])
    write_preset(config, "alpha", f'model = "llama.gguf"\nctx = 2048\nport = {free_port()}\n')
    return config


class GatewayProcess:
    def __init__(self, proc: asyncio.subprocess.Process, port: int, log: Path):
        self.proc, self.port, self.log = proc, port, log

    def text(self) -> str:
        return self.log.read_text(errors="replace")

    async def wait_for(self, text: str, timeout: float = 30) -> str:
        deadline = time.monotonic() + timeout
        while text not in self.text():
            assert time.monotonic() < deadline, f"{text!r} not logged:\n{self.text()[-3000:]}"
            await asyncio.sleep(0.1)
        return self.text()


@pytest.fixture(params=["python", *EXTRA])
async def gateway(request: pytest.FixtureRequest, running: Any, bus_address: str,
                  config: Path, tmp_path: Path) -> AsyncIterator[GatewayProcess]:
    port = free_port()
    env = dict(os.environ)
    if request.param != "python":
        env["PYTHONPATH"] = request.param
    log = tmp_path / "gateway.log"
    with open(log, "wb") as out:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "lokid", "--config-dir", str(config), "gateway", "--bus",
            "session", "--bus-address", bus_address, "--listen", f"127.0.0.1:{port}",
            stdin=subprocess.DEVNULL, stdout=out, stderr=out, env=env)
    gw = GatewayProcess(proc, port, log)
    try:
        await gw.wait_for("gateway listening")
        yield gw
        proc.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(proc.wait(), 30) == 0, gw.text()[-3000:]
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


def send_malformed(port: int, count: int) -> list[bytes]:
    """``count`` malformed requests, each on its own connection; the first line of each
    answer."""
    firsts = []
    for i in range(count):
        with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
            s.sendall(MALFORMED[i % len(MALFORMED)])
            try:
                firsts.append(s.recv(200).split(b"\r\n", 1)[0])
            except OSError:
                firsts.append(b"")
    return firsts


async def test_2000_malformed_requests_write_a_bounded_log_and_an_honest_client_is_served(
        gateway: GatewayProcess) -> None:
    before = len(gateway.text().splitlines())
    firsts = await asyncio.to_thread(send_malformed, gateway.port, 2000)
    # refused by aiohttp itself (a version may close on some without an answer)
    assert sum(f.endswith(b" 400 Bad Request") for f in firsts) >= 1500, set(firsts)
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{gateway.port}",
                                 timeout=30) as c:
        r = await c.get("/v1/models")
    assert r.status_code == 200 and [m["id"] for m in r.json()["data"]] == ["alpha"], r.text
    text = gateway.text()   # each line was written before its 400 went out
    lines = text.splitlines()[before:]
    # one line of each kind (the exception and its message), LINES_PER_WINDOW a minute:
    # at most the eight kinds sent
    assert len(lines) <= len(MALFORMED) * LINES_PER_WINDOW, "\n".join(lines)
    assert len("\n".join(lines).encode()) < 16 * 1024
    assert "Traceback" not in text and "Error handling request" not in text, text[-3000:]
    assert "sk-secret" not in text, text   # what a client sent is not written
    said = [line for line in lines if line.startswith("refused a malformed request: 400 ")]
    assert len({line.split(":")[1] for line in said}) >= 3, said   # kinds told apart


async def test_a_client_resetting_while_sending_its_body_is_gone_not_a_failure(
        gateway: GatewayProcess) -> None:
    def reset_mid_body() -> None:
        s = socket.create_connection(("127.0.0.1", gateway.port), timeout=10)
        s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                  b"Content-Type: application/json\r\nContent-Length: 100000\r\n\r\n"
                  b'{"model": "alpha", "messages": [' + b" " * 5000)
        time.sleep(0.5)   # the gateway is reading the body (its grace is 30 s)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        s.close()        # RST

    for _ in range(3):
        await asyncio.to_thread(reset_mid_body)
    text = await gateway.wait_for("client gone: POST /v1/chat/completions: 499")
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{gateway.port}",
                                 timeout=30) as c:
        assert (await c.get("/health")).status_code == 200
    text = gateway.text()
    assert "Traceback" not in text and "the gateway failed" not in text, text[-3000:]
