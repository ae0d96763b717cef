"""The gateway under hostile or careless clients: a request head that never ends (408), a
thousand connections opened and closed (no file descriptor left behind, memory bounded).
The real daemon on a private bus, each test on asyncio's loop and on uvloop's; the 1,000
connections go to the real ``lokid gateway`` process, whose /proc is read."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from support.enginekit import free_port, write_config, write_preset
from support.gatewaykit import LOOPS, gateway_on, loop_policy

from lokid.gateway.server import Gateway

HEAD = b"POST /v1/chat/completions HTTP/1.1\r\nHost: [::1]\r\nContent-Type: application/json\r\n"


@pytest.fixture
def config(tmp_path: Path, engine: str, models: Any) -> Path:
    assert Path(models.llama).name == "llama.gguf"   # written now
    config = write_config(tmp_path, engine, [models.dir])
    write_preset(config, "alpha", f'model = "llama.gguf"\nctx = 2048\nport = {free_port()}\n')
    return config


@pytest.fixture(params=LOOPS)
def event_loop_policy(request: pytest.FixtureRequest) -> asyncio.AbstractEventLoopPolicy:
    """Each test on both loops the gateway runs on (lokid.gateway.server.run): uvloop's
    transports and timers are not asyncio's."""
    return loop_policy(request.param)


@pytest.fixture
async def quick(running: Any, bus_address: str) -> AsyncIterator[Gateway]:
    """The gateway with a head deadline of half a second."""
    async with gateway_on(bus_address, head_timeout=0.5) as gw:
        yield gw


async def connect(gw: Gateway) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    port = int(gw.url.rsplit(":", 1)[1])  # type: ignore[attr-defined]
    return await asyncio.open_connection("127.0.0.1", port)


async def timed_out(reader: asyncio.StreamReader, within: float) -> float:
    """Seconds until the 408 came, after checking it whole and the connection closed."""
    t = time.monotonic()
    reply = await asyncio.wait_for(reader.read(), within)   # to EOF: the gateway closes
    head, _, body = reply.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 408 "), reply
    assert b"Connection: close" in head
    assert json.loads(body)["error"]["code"] == "request_timeout"
    return time.monotonic() - t


async def test_a_head_that_never_ends_is_answered_408(quick: Gateway) -> None:
    reader, writer = await connect(quick)
    writer.write(HEAD + b"X-Half: ")
    assert await timed_out(reader, 5) < 2
    writer.close()


async def test_a_trickled_head_does_not_stretch_its_deadline(quick: Gateway) -> None:
    reader, writer = await connect(quick)
    t = time.monotonic()

    async def trickle() -> None:
        writer.write(HEAD)
        for i in range(40):   # a header line every 0.05 s for 2 s
            writer.write(b"X-%d: y\r\n" % i)
            await asyncio.sleep(0.05)

    task = asyncio.create_task(trickle())
    await timed_out(reader, 5)
    assert time.monotonic() - t < 1.5   # half a second from its first byte, not 2 s
    task.cancel()
    writer.close()


async def test_bytes_sent_after_the_408_do_not_reset_it_away(quick: Gateway) -> None:
    """A client still sending its head when the 408 came: closed at once, the gateway's
    socket answered those bytes with a reset, and the reset took the 408 out of the
    client's buffer (Connection reset by peer; seen in the Debian 13 container). Now it
    is half-closed and lingers: the late bytes are dropped, the 408 is read whole."""
    reader, writer = await connect(quick)
    writer.write(HEAD)
    await asyncio.sleep(1.0)          # past the 0.5 s deadline: the 408 is on its way
    for _ in range(3):                # what a trickling client sends next: the first
        writer.write(b"X-Late: y\r\n")  # meets a closed socket's reset, the next ones
        await asyncio.sleep(0.2)      # the transport's error, which empties its reader
    await timed_out(reader, 5)
    writer.close()


async def test_the_deadline_holds_for_the_next_head_of_a_keep_alive_connection(
        quick: Gateway) -> None:
    reader, writer = await connect(quick)
    writer.write(b"GET /health HTTP/1.1\r\nHost: gateway\r\n\r\n")
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
    assert head.startswith(b"HTTP/1.1 200 ")
    length = int(next(line.split(b":")[1] for line in head.split(b"\r\n")
                      if line.lower().startswith(b"content-length")))
    await reader.readexactly(length)
    await asyncio.sleep(0.8)   # idle between requests: no deadline runs
    writer.write(b"GET /health HTTP/1.1\r\nHost: gate")
    assert await timed_out(reader, 5) < 2
    writer.close()


async def test_a_slow_body_or_an_idle_connection_is_not_a_slow_head(quick: Gateway) -> None:
    idle_reader, idle_writer = await connect(quick)
    reader, writer = await connect(quick)
    body = b'{"model": "nope", "messages": []}'
    writer.write(HEAD + b"Content-Length: %d\r\n\r\n" % len(body))
    await asyncio.sleep(1.0)   # twice the head's deadline, the head itself complete
    writer.write(body)
    reply = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
    assert reply.startswith(b"HTTP/1.1 404 "), reply   # the unknown model, answered
    assert not idle_reader.at_eof() and not idle_writer.is_closing()
    idle_writer.write(b"GET /health HTTP/1.1\r\nHost: gateway\r\n\r\n")
    assert (await asyncio.wait_for(idle_reader.readuntil(b"\r\n\r\n"), 5)).startswith(
        b"HTTP/1.1 200 ")
    for w in (writer, idle_writer):
        w.close()


# --- a thousand connections to the real process ------------------------------------------

CONNECTIONS = 1000


def fds(pid: int) -> int:
    return len(list(Path(f"/proc/{pid}/fd").iterdir()))


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


async def steady(pid: int) -> int:
    """The count of descriptors once it held for 0.2 s (a closing connection ends)."""
    last, deadline = fds(pid), time.monotonic() + 10
    while time.monotonic() < deadline:
        await asyncio.sleep(0.2)
        now = fds(pid)
        if now == last:
            return now
        last = now
    return last


async def settle(pid: int, at_most: int, within: float) -> int:
    deadline = time.monotonic() + within
    while (n := fds(pid)) > at_most and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    return n


@pytest.mark.slow
async def test_a_thousand_connections_leave_no_descriptor_behind(
        running: Any, bus_address: str, config: Path) -> None:
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "lokid", "--config-dir", str(config), "gateway", "--bus",
         "session", "--bus-address", bus_address, "--listen", f"127.0.0.1:{port}"],
        stdin=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        url = f"http://127.0.0.1:{port}"
        async with httpx.AsyncClient(base_url=url, timeout=5) as c:
            deadline = time.monotonic() + 30
            while True:
                try:
                    assert (await c.get("/health")).status_code == 200
                    break
                except httpx.TransportError:
                    assert time.monotonic() < deadline and proc.poll() is None
                    await asyncio.sleep(0.1)
            await c.get("/v1/models")
        before = await steady(proc.pid)   # the client's connections above are gone
        rss_before = rss_mib(proc.pid)

        conns = []
        for i in range(CONNECTIONS):
            conns.append(await asyncio.open_connection("127.0.0.1", port))
            if i % 3 == 1:   # a third asks once and stays open (keep-alive)
                conns[-1][1].write(b"GET /health HTTP/1.1\r\nHost: gateway\r\n\r\n")
            elif i % 3 == 2:   # a third starts a head and stops
                conns[-1][1].write(HEAD)
        for reader, _ in conns[1::3]:
            assert (await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)).startswith(
                b"HTTP/1.1 200 ")
        deadline = time.monotonic() + 10
        while fds(proc.pid) < before + CONNECTIONS and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        held, rss_held = fds(proc.pid), rss_mib(proc.pid)
        assert held >= before + CONNECTIONS   # each one really accepted

        for _, writer in conns:
            writer.close()
        after = await settle(proc.pid, before, 10)
        rss_after = rss_mib(proc.pid)
        async with httpx.AsyncClient(base_url=url, timeout=5) as c:
            assert (await c.get("/health")).status_code == 200   # still serving
        print(f"\nfds {before} -> {held} with {CONNECTIONS} open -> {after}; RSS "
              f"{rss_before:.1f} -> {rss_held:.1f} -> {rss_after:.1f} MiB")
        assert after <= before
        assert rss_held - rss_before < 25, (rss_before, rss_held)   # ~25 KiB a connection
        assert rss_after - rss_before < 25
    finally:
        proc.terminate()
        proc.wait(30)
