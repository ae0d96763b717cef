#!/usr/bin/env python3
"""The daemon's cost while an engine serves: its CPU beside the engine's, and how soon a
request shows in the preset's Stats.

``lokid daemon`` (session bus, local runner: the engine's lines come through its pipe;
under systemd they come through the journal) serving the tiny llama, started through
the bus. Then, side by side in one run:

- a client sends --rate requests per second (default 50; short prompts, 4 tokens
  generated) for --seconds while another reads the preset's Stats once a second (as
  ``lokictl top`` does); the daemon's CPU over that time, against the engine's own
  (the reference: the work being measured), and the daemon's RSS;
- then the same load again, and for one request in ten: the time from the client's
  reply to a ``Properties.Get(Stats)`` whose request count includes it (event → D-Bus
  property), polled every 5 ms. Apart from the CPU phase: those polls (tens a
  second) are the measurement's own load, not the daemon's;
- the daemon's CPU over --idle seconds with the engine running and no request.

Goals (issue 14): daemon CPU <= 2 % under 50 requests/s, event → property p99 <= 100 ms,
idle CPU <= 0.1 %, RSS <= 45 MB. Exits 1 when one is missed.

    .venv/bin/python benchmarks/daemon_load.py [--rate 50] [--seconds 20] [--idle 20]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

# the daemon's process figures and StartPreset → ready, as the D-Bus API benchmark does
from dbus_api import proc_cpu_s, proc_rss_mb, start_until_ready  # noqa: E402


def engine_pids(root_pid: int) -> list[int]:
    """Every descendant of ``root_pid`` (the daemon): lokid engine, llama-server."""
    out, todo = [], [root_pid]
    while todo:
        pid = todo.pop()
        for task in Path(f"/proc/{pid}/task").glob("*"):
            try:
                children = (task / "children").read_text().split()
            except OSError:
                continue
            for child in map(int, children):
                out.append(child)
                todo.append(child)
    return out


async def load(url: str, address: str, rate: float, seconds: float, probe: bool
               ) -> tuple[int, list[float], int]:
    """``rate`` requests/s for ``seconds``; (replies, event→property latencies, errors).
    ``probe``: time one request in ten to its Stats; else read Stats once a second."""
    import httpx
    from dbus_fast import Message
    from dbus_fast.aio import MessageBus

    from lokid.core.names import BUS_NAME, PRESET_INTERFACE, preset_object_path

    bus = await MessageBus(bus_address=address).connect()
    get = Message(destination=BUS_NAME, path=preset_object_path("tiny"),
                  interface="org.freedesktop.DBus.Properties", member="Get",
                  signature="ss", body=[PRESET_INTERFACE, "Stats"])

    async def seen() -> int:
        reply = await bus.call(get)
        assert reply is not None
        stats = reply.body[0].value
        return int(stats["requests"].value) if "requests" in stats else 0

    base = await seen()
    done = errors = 0
    latencies: list[float] = []
    sampling = asyncio.Lock()

    async def one(client: httpx.AsyncClient, i: int) -> None:
        nonlocal done, errors
        r = await client.post(url + "/v1/chat/completions", json={
            "messages": [{"role": "user", "content": f"Hi {i}"}], "max_tokens": 4,
            "temperature": 0})
        if r.status_code != 200:
            errors += 1
            return
        done += 1
        if probe and i % 10 == 0 and not sampling.locked():
            async with sampling:   # one probe at a time: the bus is not the load
                want, t0 = base + done, time.perf_counter()
                while await seen() < want and time.perf_counter() - t0 < 5:
                    await asyncio.sleep(0.005)  # the polls cost the daemon too
                latencies.append(time.perf_counter() - t0)

    async def top() -> None:
        while True:
            await seen()
            await asyncio.sleep(1.0)

    reader = None if probe else asyncio.create_task(top())
    async with httpx.AsyncClient(timeout=60) as client:
        tasks = []
        start = time.perf_counter()
        for i in range(int(rate * seconds)):
            delay = start + i / rate - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(one(client, i)))
        await asyncio.gather(*tasks)
    if reader is not None:
        reader.cancel()
    bus.disconnect()
    return done, latencies, errors


def cpu(pids: list[int]) -> float:
    total = 0.0
    for pid in pids:
        try:
            total += proc_cpu_s(pid)
        except OSError:
            pass
    return total


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rate", type=float, default=50)
    ap.add_argument("--seconds", type=float, default=20)
    ap.add_argument("--idle", type=float, default=20)
    args = ap.parse_args()
    from support.daemonproc import daemon_process
    from support.enginekit import free_port, tiny_config

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        port = free_port()
        config = tiny_config(root, "tiny", f"port = {port}\n")
        with daemon_process(config, root) as d:
            address, pid = d.address, d.proc.pid
            asyncio.run(start_until_ready(address))
            engine = engine_pids(pid)
            d0, e0, t0 = proc_cpu_s(pid), cpu(engine), time.monotonic()
            done, _, errors = asyncio.run(
                load(f"http://127.0.0.1:{port}", address, args.rate, args.seconds, False))
            took = time.monotonic() - t0
            daemon_cpu = (proc_cpu_s(pid) - d0) / took * 100
            engine_cpu = (cpu(engine) - e0) / took * 100
            _, latencies, errors2 = asyncio.run(
                load(f"http://127.0.0.1:{port}", address, args.rate, args.seconds, True))
            errors += errors2
            rss = proc_rss_mb(pid)
            i0, ti = proc_cpu_s(pid), time.monotonic()
            time.sleep(args.idle)
            idle = (proc_cpu_s(pid) - i0) / (time.monotonic() - ti) * 100

    p99 = sorted(latencies)[min(len(latencies) - 1, int(0.99 * len(latencies)))] * 1000
    print(f"load: {done} replies ({errors} errors) in {took:.1f} s = {done / took:.1f} req/s "
          f"(asked {args.rate:g}/s)")
    print(f"CPU under load: daemon {daemon_cpu:.2f} %, engine {engine_cpu:.1f} % "
          f"(ratio daemon/engine {daemon_cpu / max(engine_cpu, 1e-9):.4f}); goal daemon <= 2 %")
    print(f"event -> Stats property, {len(latencies)} samples: median "
          f"{statistics.median(latencies) * 1000:.1f} ms, p99 {p99:.1f} ms; goal p99 <= 100 ms")
    print(f"idle with the engine running: daemon {idle:.3f} % CPU, RSS {rss:.1f} MB; "
          "goals <= 0.1 %, <= 45 MB")
    ok = daemon_cpu <= 2 and p99 <= 100 and idle <= 0.1 and rss <= 45
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
