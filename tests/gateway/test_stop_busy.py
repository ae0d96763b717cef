"""A stop of a busy engine cuts at once, its client's stream ended with an error event
(issue 45, item 12): the real daemon (local runner: ``lokid engine`` supervising the real
llama-server), the real gateway, a private bus.

llama-server b11434 ends its task loop at the first SIGTERM and then waits for its HTTP
threads, which wait for the results of tasks that no longer run: a busy engine stops
generating and hangs, its clients' streams stalled (measured here: 1 token in the 4 s
after the first SIGTERM, the process alive until the second). The supervisor's second
SIGTERM came 10 s later ("still running 10 s after SIGTERM: sending it again"): a stop
waited 10 s and then cut anyway (this test measured 10.2 s before the change). A stop
now cuts (the second SIGTERM follows after :data:`lokid.unit.supervisor.STOP_RESEND`);
the drain is the unload's (``lokictl unload``, tests/gateway/test_unload_traffic.py).

The engine serves a model slow enough (3 layers, 384 wide, one thread: tens of tokens a
second) that a stream of 1,500 tokens runs for a minute.
"""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from support.enginekit import free_port, write_config, write_preset
from support.models import write_slow_llama
from support.sse import data_lines

from lokid.core.names import MANAGER_INTERFACE, OBJECT_PATH
from lokid.gateway.server import Gateway

pytestmark = [pytest.mark.engine, pytest.mark.slow]

OLD_RESEND = 10.0   # the second SIGTERM of the old supervisor


@pytest.fixture
def config(tmp_path: Path, engine: str) -> Path:
    models = tmp_path / "models"
    models.mkdir()
    write_slow_llama(models / "slow.gguf")
    config = write_config(tmp_path, engine, [models])
    write_preset(config, "slow", 'model = "slow.gguf"\nctx = 4096\nextra_args = ["-t", "1"]\n'
                 f"port = {free_port()}\n")
    return config


async def stream(url: str, started: asyncio.Event, events: list[dict[str, Any]]) -> float:
    """A /completion stream of 1,500 tokens through the gateway, its events kept;
    ``started`` once 5 came; returns when it ended (monotonic)."""
    body = {"model": "slow", "prompt": "Once", "n_predict": 1500, "ignore_eos": True,
            "stream": True, "temperature": 1.0}
    async with httpx.AsyncClient(timeout=300) as c:
        async with c.stream("POST", f"{url}/completion", json=body) as r:
            assert r.status_code == 200, await r.aread()
            async for data in data_lines(r):
                events.append(json.loads(data))
                if len(events) == 5:
                    started.set()
    return time.monotonic()


async def test_a_stop_of_a_busy_engine_cuts_its_stream_at_once(
        running: Any, gateway: Gateway) -> None:
    manager = await running.iface(OBJECT_PATH, MANAGER_INTERFACE)
    await manager.call_start_preset("slow")
    await running.wait_event("slow", "ready")
    events: list[dict[str, Any]] = []
    started = asyncio.Event()
    task = asyncio.create_task(stream(gateway.url, started, events))  # type: ignore[attr-defined]
    await asyncio.wait_for(started.wait(), 120)
    seen = len(running.events)
    asked = time.monotonic()
    await manager.call_stop_preset("slow")
    await running.wait_event("slow", "inactive", after=seen)
    stopped = time.monotonic() - asked
    ended = await asyncio.wait_for(task, 60) - asked
    # cut, not waited for: the stream was far from its end, and both the stop and the
    # client's stream ended well before the old second SIGTERM
    assert stopped < OLD_RESEND / 2, f"the stop took {stopped:.1f} s"
    assert ended < OLD_RESEND / 2, f"the client's stream ended {ended:.1f} s after the stop"
    # the client was told: the gateway's last event holds the error, after the tokens
    assert "error" in events[-1], events[-1]
    assert not any(e.get("stop") is True for e in events), events[-1]
    assert sum(1 for e in events if "content" in e) < 1500
    # a stop asked for is a clean stop: inactive, never failed
    states = [e[1] for e in running.events[seen:] if e[0] == "slow"]
    assert "failed" not in states, states
