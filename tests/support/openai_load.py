"""The OpenAI-style load the gateway and relay benchmarks put on an engine, one copy:
one chat request at a time, 16 concurrent streams (tokens carried and time to the
first one), percentiles, a process's CPU time from /proc. Not a benchmark itself.

``model``: the ``model`` field to send (the gateway routes by it; an engine reached
directly is sent none)."""

from __future__ import annotations

import asyncio
import json
import os
import statistics
import time
from pathlib import Path

import aiohttp

STREAMS = 16


def chat(max_tokens: int, stream: bool = False, model: str | None = None) -> dict[str, object]:
    body: dict[str, object] = {"messages": [{"role": "user", "content": "Hello"}],
                               "max_tokens": max_tokens, "temperature": 0, "seed": 1,
                               "stream": stream, "ignore_eos": True}
    if model is not None:
        body["model"] = model
    return body


def pct(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(p / 100 * len(ordered)))]


async def one(session: aiohttp.ClientSession, url: str, model: str | None = None) -> float:
    t = time.perf_counter()
    async with session.post(url + "/v1/chat/completions", json=chat(1, model=model)) as r:
        await r.read()
        assert r.status == 200, r.status
    return time.perf_counter() - t


async def stream(session: aiohttp.ClientSession, url: str, tokens: int,
                 model: str | None = None) -> tuple[int, float]:
    """Tokens carried (content events) and the time to the first one."""
    t = time.perf_counter()
    first, count = 0.0, 0
    async with session.post(url + "/v1/chat/completions",
                            json=chat(tokens, True, model)) as r:
        assert r.status == 200, r.status
        async for line in r.content:
            if not line.startswith(b"data: {"):
                continue
            delta = json.loads(line[6:])["choices"]
            if delta and delta[0]["delta"].get("content") is not None:
                count += 1
                if not first:
                    first = time.perf_counter() - t
    return count, first


async def concurrent(session: aiohttp.ClientSession, url: str, tokens: int,
                     model: str | None = None) -> tuple[float, float]:
    """Tokens/s of :data:`STREAMS` concurrent streams, and their median first token."""
    t = time.perf_counter()
    got = await asyncio.gather(*(stream(session, url, tokens, model) for _ in range(STREAMS)))
    wall = time.perf_counter() - t
    return sum(n for n, _ in got) / wall, statistics.median(f for _, f in got)


def cpu_seconds(pid: int) -> float:
    """utime + stime of the process, from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
