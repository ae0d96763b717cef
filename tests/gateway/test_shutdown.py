"""``lokid gateway`` stopped by SIGTERM while it relays a stream (issue 28, item 16): the
real process, the real daemon (local runner) and the real engine on a private bus.

Before, SIGTERM ran aiohttp's cleanup, which waited for the stream up to 60 s and then
again (and, on Python 3.12, for every connection to close): the stop outlasted the unit's
TimeoutStopSec, systemd killed it, and the stream was cut without a word. Now accepting
stops, idle keep-alive connections are closed at once, the stream runs to its end within
its preset's drain (capped), or is ended at the drain with a last error event, and the
process exits 0. The restart under systemd: tests/gateway/test_units_systemd.py.

The engine serves a model slow enough (3 layers, 384 wide, one thread: tens of tokens a
second) that a few hundred tokens are still streaming when the signal comes.
"""

from __future__ import annotations

import asyncio
import json
import signal
import socket
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
from support.enginekit import free_port, write_config, write_preset
from support.gatewaykit import health_answered
from support.models import write_slow_llama
from support.sse import data_lines

pytestmark = [pytest.mark.engine, pytest.mark.slow]

SLOW = 'model = "slow.gguf"\nctx = 4096\nextra_args = ["-t", "1"]\n'


@pytest.fixture
def config(tmp_path: Path, engine: str) -> Path:
    models = tmp_path / "models"
    models.mkdir()
    write_slow_llama(models / "slow.gguf")
    config = write_config(tmp_path, engine, [models])
    write_preset(config, "slow", f"{SLOW}port = {free_port()}\n[serve]\non_demand = true\n")
    # a drain of a second: what a swap of it would wait, and what a stop waits too
    write_preset(config, "brief", f"{SLOW}port = {free_port()}\n[serve]\non_demand = true\n"
                 'drain = "1s"\n')
    return config


@asynccontextmanager
async def gateway_process(config: Path, bus_address: str, port: int
                          ) -> AsyncIterator[asyncio.subprocess.Process]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "lokid", "--config-dir", str(config), "gateway", "--bus",
        "session", "--bus-address", bus_address, "--listen", f"127.0.0.1:{port}",
        stdin=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        await health_answered(port, proc)
        yield proc
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


async def stream(port: int, model: str, tokens: int, started: asyncio.Event,
                 events: list[dict[str, Any]]) -> None:
    """A /completion stream of ``tokens``, its events kept; ``started`` once 5 came."""
    body = {"model": model, "prompt": "Once", "n_predict": tokens, "ignore_eos": True,
            "stream": True, "temperature": 1.0}
    async with httpx.AsyncClient(timeout=300) as c:
        async with c.stream("POST", f"http://127.0.0.1:{port}/completion", json=body) as r:
            assert r.status_code == 200, await r.aread()
            async for data in data_lines(r):
                events.append(json.loads(data))
                if len(events) == 5:
                    started.set()


async def stopped(proc: asyncio.subprocess.Process) -> tuple[int, str]:
    """SIGTERM, then the exit status and what it said."""
    proc.send_signal(signal.SIGTERM)
    code = await asyncio.wait_for(proc.wait(), 60)
    assert proc.stderr is not None
    return code, (await proc.stderr.read()).decode()


async def test_a_stream_in_flight_runs_to_its_end_and_idle_connections_close_at_once(
        running: Any, bus_address: str, config: Path) -> None:
    port = free_port()
    async with gateway_process(config, bus_address, port) as proc:
        # an idle keep-alive connection: one request answered, then nothing
        idle = socket.create_connection(("127.0.0.1", port), timeout=30)
        idle.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
        assert idle.recv(4096).startswith(b"HTTP/1.1 200")
        events: list[dict[str, Any]] = []
        started = asyncio.Event()
        task = asyncio.create_task(stream(port, "slow", 1500, started, events))
        await asyncio.wait_for(started.wait(), 120)
        proc.send_signal(signal.SIGTERM)
        # the idle connection is closed at once, while the stream still runs: the
        # client's next request goes to the next instance
        idle.settimeout(20)
        assert await asyncio.to_thread(idle.recv, 4096) == b""
        idle.close()
        streamed_then = len(events)
        await asyncio.wait_for(task, 120)
        code = await asyncio.wait_for(proc.wait(), 60)
        assert proc.stderr is not None
        said = (await proc.stderr.read()).decode()
    # the whole stream, not a cut: every token and the engine's last event
    assert events[-1].get("stop") is True and events[-1]["tokens_predicted"] == 1500, \
        events[-1]
    assert streamed_then < len(events)
    assert not any("error" in e for e in events)
    assert code == 0, said
    assert "stopping: 1 request(s) in flight" in said, said
    assert "stopped: 1 request(s) ended by themselves, 0 at their drain" in said, said
    assert "Traceback" not in said


async def test_a_stream_past_its_presets_drain_ends_with_an_error_event(
        running: Any, bus_address: str, config: Path) -> None:
    port = free_port()
    async with gateway_process(config, bus_address, port) as proc:
        events: list[dict[str, Any]] = []
        started = asyncio.Event()
        # thousands of tokens: minutes at this model's pace, far past a drain of 1 s
        task = asyncio.create_task(stream(port, "brief", 4000, started, events))
        await asyncio.wait_for(started.wait(), 120)
        code, said = await stopped(proc)
        await asyncio.wait_for(task, 60)   # the stream ended: neither cut nor hanging
    last = events[-1]
    assert last["error"]["code"] == "gateway_stopping", last
    assert "send the request again" in last["error"]["message"], last
    assert not any(e.get("stop") for e in events[:-1])   # ended before the engine's end
    assert code == 0, said
    assert "stopped: 0 request(s) ended by themselves, 1 at their drain" in said, said
    assert "Traceback" not in said


async def test_a_request_waiting_for_its_answer_at_the_drain_gets_503(
        running: Any, bus_address: str, config: Path) -> None:
    """Not streamed: nothing of the answer was sent when the drain passed, so the client
    gets the reason in OpenAI's shape."""
    port = free_port()
    async with gateway_process(config, bus_address, port) as proc:
        async with httpx.AsyncClient(timeout=300) as c:
            await c.post(f"http://127.0.0.1:{port}/completion",   # started, then served
                         json={"model": "brief", "prompt": "x", "n_predict": 1})
            body = {"model": "brief", "prompt": "Once", "n_predict": 4000, "ignore_eos": True}
            task = asyncio.create_task(c.post(f"http://127.0.0.1:{port}/completion",
                                              json=body))
            await asyncio.sleep(2)   # the engine is generating
            assert not task.done()
            code, said = await stopped(proc)
            reply = await asyncio.wait_for(task, 60)
    assert reply.status_code == 503, reply.text
    assert reply.json()["error"]["code"] == "gateway_stopping"
    assert code == 0, said
    assert "Traceback" not in said
