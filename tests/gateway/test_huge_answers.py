"""What the gateway relays costs a bounded buffer, whatever its size, to a client that
does not read (issue 45, item 2): the real gateway process (``lokid gateway``, on the
daemon's private bus) between a client that sends its request and reads nothing and a
stand-in that answers 600 MiB (:mod:`support.hugeanswer`, its own process): an external
API's answer with a length and one in chunks on one line (both renamed to the preset),
a peer gateway's answer and its streamed answer (carried as bytes, the engines' path).

The stand-in writes only as fast as the gateway reads; once it is stalled, the gateway's
peak resident memory (VmHWM, /proc) is read: before the change the gateway read the whole
answer (its memory grew by 600 MiB and more, where ``MemoryMax=1G`` would have killed
it). The client then reads the whole answer: nothing lost, the model renamed."""

from __future__ import annotations

import asyncio
import json
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from support.enginekit import free_port, write_config, write_preset

pytestmark = [pytest.mark.slow]

HUGE = 600 * 1024 * 1024          # the answer's bytes, as in the issue
BOUND_MIB = 64                    # the gateway's growth allowed while it relays it
STANDIN = Path(__file__).parent.parent / "support" / "hugeanswer.py"


def status_kib(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise AssertionError(f"no {field} in /proc/{pid}/status")


@pytest.fixture
def standin(tmp_path: Path) -> Iterator[tuple[Path, dict[str, int]]]:
    """The stand-in's record file and its port per mode."""
    ports = {"length": free_port(), "chunked": free_port()}
    record = tmp_path / "record"
    proc = subprocess.Popen([sys.executable, str(STANDIN), str(record), str(HUGE)]
                            + [f"{m}:{p}" for m, p in ports.items()],
                            stdout=subprocess.PIPE, stdin=subprocess.DEVNULL)
    try:
        assert proc.stdout is not None and proc.stdout.readline() == b"ready\n"
        yield record, ports
    finally:
        proc.terminate()
        proc.wait(30)


@pytest.fixture
def config(tmp_path: Path, engine: str, standin: tuple[Path, dict[str, int]]) -> Path:
    _, ports = standin
    config = write_config(tmp_path, engine, [tmp_path])
    with (config / "lokid.toml").open("a") as f:
        f.write(f'[gateway]\npeers = [{{ name = "lenpeer", url = '
                f'"http://127.0.0.1:{ports["length"]}" }}]\n')
    write_preset(config, "lenapi", f'kind = "external"\nurl = "http://127.0.0.1:'
                 f'{ports["length"]}/v1"\nupstream_model = "up-len"\n')
    write_preset(config, "chunkapi", f'kind = "external"\nurl = "http://127.0.0.1:'
                 f'{ports["chunked"]}/v1"\nupstream_model = "up-chunk"\n')
    return config


@pytest.fixture
async def gateway(running: Any, bus_address: str, config: Path, tmp_path: Path
                  ) -> AsyncIterator[tuple[int, int]]:
    """The real gateway process: its port and pid, once it lists the external presets
    and the peer's model."""
    port = free_port()
    with (tmp_path / "gateway.log").open("wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "lokid", "--config-dir", str(config), "gateway", "--bus",
             "session", "--bus-address", bus_address, "--listen", f"127.0.0.1:{port}"],
            stdin=subprocess.DEVNULL, stdout=log, stderr=log)
    try:
        deadline = time.monotonic() + 60
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=5) as c:
            while True:
                assert proc.poll() is None, (tmp_path / "gateway.log").read_text()
                assert time.monotonic() < deadline, (tmp_path / "gateway.log").read_text()
                try:
                    r = await c.get("/v1/models")
                    if {"lenapi", "chunkapi", "length-model"} <= {
                            m["id"] for m in r.json()["data"]}:
                        break
                except httpx.TransportError:
                    pass
                await asyncio.sleep(0.2)
        yield port, proc.pid
    finally:
        proc.terminate()
        proc.wait(30)


async def stalled(sent: Path, within: float = 120) -> int:
    """The stand-in's bytes sent once they stop growing for 2 s (or reach the whole)."""
    last, still, deadline = -1, 0, time.monotonic() + within
    while time.monotonic() < deadline:
        await asyncio.sleep(0.5)
        n = int(sent.read_text()) if sent.exists() else 0
        if n >= HUGE:
            return n
        still = still + 1 if n == last and n > 0 else 0
        if still >= 4:
            return n
        last = n
    raise AssertionError(f"the stand-in sent {last} bytes, still going after {within} s")


async def read_all(sock: socket.socket) -> tuple[int, bytes, bytes]:
    """Bytes read until the gateway closes: their count, the first 4 KiB, the last 64."""
    loop = asyncio.get_running_loop()
    total, first, last = 0, b"", b""
    while True:
        data = await asyncio.wait_for(loop.sock_recv(sock, 1024 * 1024), 60)
        if not data:
            return total, first, last
        total += len(data)
        if len(first) < 4096:
            first = (first + data)[:4096]
        last = (last + data)[-64:]


CASES = {   # id: the model asked, whether it asks to stream, the stand-in's mode, the name
    "external-length": ("lenapi", False, "length", "lenapi"),
    "external-chunked": ("chunkapi", False, "chunked", "chunkapi"),
    "peer": ("length-model", False, "length", "length-model"),
    "peer-stream": ("length-model", True, "length", "length-model"),
}


@pytest.mark.parametrize("case", list(CASES))
async def test_a_huge_answer_to_a_client_that_does_not_read_costs_a_bounded_buffer(
        gateway: tuple[int, int], standin: tuple[Path, dict[str, int]], case: str) -> None:
    port, pid = gateway
    record, _ = standin
    model, stream, mode, named = CASES[case]
    body = json.dumps({"model": model, "messages": [{"role": "user", "content": "Hi"}],
                       **({"stream": True} if stream else {})}).encode()
    before = status_kib(pid, "VmRSS")
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)   # reads nothing for now
    sock.setblocking(False)
    loop = asyncio.get_running_loop()
    try:
        await loop.sock_connect(sock, ("127.0.0.1", port))
        await loop.sock_sendall(sock, b"POST /v1/chat/completions HTTP/1.1\r\n"
                                b"Host: 127.0.0.1:%d\r\nContent-Type: application/json\r\n"
                                b"Connection: close\r\nContent-Length: %d\r\n\r\n%b"
                                % (port, len(body), body))
        sent = await stalled(Path(f"{record}.{mode}.sent"))
        peak = status_kib(pid, "VmHWM")
        print(f"\n{case}: gateway VmRSS {before / 1024:.0f} MiB before, VmHWM "
              f"{peak / 1024:.0f} MiB with the stand-in stalled at {sent / 2**20:.0f} of "
              f"{HUGE / 2**20:.0f} MiB")
        assert sent < HUGE, "the gateway read the whole answer for a client that reads nothing"
        assert (peak - before) / 1024 < BOUND_MIB, (before, peak)

        total, first, last = await read_all(sock)   # then the client reads it all
    finally:
        sock.close()
    assert first.startswith(b"HTTP/1.1 200 "), first[:200]
    assert b'"model":%b' % json.dumps(named).encode() in first, first[:600]
    assert total > HUGE and (last.endswith(b'a"}') or last.endswith(b'a"}\r\n0\r\n\r\n')), \
        (total, last)
    assert int(Path(f"{record}.{mode}.sent").read_text()) == HUGE
