#!/usr/bin/env python3
"""What a hostile body costs ``lokid gateway``: five gzip bombs at once, side by side with
what parsing one whole (``json.loads``, the gateway's way before issue 28) costs.

One run sets up the real stack on a private bus (a dbus-daemon, ``lokid daemon`` on its
local runner with one on-demand preset of the generated tiny llama, ``lokid gateway`` in
its own process). Then:

- the reference: ``json.loads`` of one bomb's inflated body (``{"m": [{}, {}, ...],
  "model": ...}``, 63 MiB from ~64 KB of gzip) in a child interpreter: its time and its
  peak RSS;
- the gateway: ``--bombs`` (5) such bodies POSTed at once with ``Content-Encoding: gzip``,
  while ``/health`` is asked every 10 ms: the answers' statuses, the gateway's peak RSS
  (``VmHWM``) against before, and the longest ``/health`` wait during the bombs (the
  event loop held).

Issue 28 measured the gateway at 1,727,964 KiB peak RSS for one bomb and ``/health``
blocked 7.9 s by five. Measured after it (2-CPU machine, aiohttp 3.14, uvloop): five
413s in 1.04 s, peak RSS 44,096 -> 431,596 KiB (each body is held inflated, up to
max_body, and joined once: twice its size at the peak), ``/health`` waited 335 ms at
most; the reference json.loads of one: 5.76 s and 1,692,696 KiB.

    .venv/bin/python benchmarks/gateway_hostile.py [--bombs 5]
"""

from __future__ import annotations

import argparse
import asyncio
import gzip
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT))

import aiohttp  # noqa: E402
from gateway_latency import gateway_process  # noqa: E402
from support.daemonproc import daemon_process  # noqa: E402
from support.enginekit import free_port, tiny_config  # noqa: E402

PRESET = "tiny"
BOMB = b'{"m": [' + b"{}," * (21 * 1024 * 1024) + b'{}], "model": "tiny"}'
REFERENCE = ("import json, resource, sys, time; b = sys.stdin.buffer.read();"
             " t = time.perf_counter(); json.loads(b); print(time.perf_counter() - t,"
             " resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)")


def hwm_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    return 0


async def measure(url: str, pid: int, bombs: int) -> None:
    packed = gzip.compress(BOMB)
    before = hwm_kib(pid)
    waits: list[float] = []
    done = asyncio.Event()
    async with aiohttp.ClientSession() as session:
        async def health() -> None:
            while not done.is_set():
                t = time.perf_counter()
                async with session.get(url + "/health") as r:
                    await r.read()
                waits.append(time.perf_counter() - t)
                await asyncio.sleep(0.01)

        async def bomb() -> int:
            async with session.post(url + "/completion", data=packed,
                                    headers={"Content-Encoding": "gzip"}) as r:
                await r.read()
                return r.status

        poller = asyncio.create_task(health())
        t0 = time.perf_counter()
        statuses = await asyncio.gather(*(bomb() for _ in range(bombs)))
        took = time.perf_counter() - t0
        done.set()
        await poller
    print(f"lokid gateway, {bombs} bombs of {len(packed) / 1024:.0f} KiB gzip "
          f"({len(BOMB) / 2**20:.0f} MiB inflated) at once:")
    print(f"  answers: {sorted(statuses)} in {took:.2f} s")
    print(f"  peak RSS: {before:,} KiB before, {hwm_kib(pid):,} KiB after")
    print(f"  /health: {len(waits)} answers meanwhile, longest wait {max(waits) * 1000:.0f} ms")
    ref = subprocess.run([sys.executable, "-c", REFERENCE], input=BOMB, capture_output=True,
                         check=True).stdout.split()
    seconds, kib = float(ref[0]), int(ref[1])
    print(f"reference, json.loads of one inflated bomb: {seconds:.2f} s, peak RSS {kib:,} KiB")
    print(f"  ratio, peak RSS growth of the gateway for {bombs} / json.loads for 1: "
          f"{(hwm_kib(pid) - before) / kib:.3f}")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument("--bombs", type=int, default=5)
    args = p.parse_args()
    with tempfile.TemporaryDirectory(prefix="lokid-gw-hostile-") as tmp:
        root = Path(tmp)
        gw_port = free_port()
        config = tiny_config(root, PRESET, f"port = {free_port()}\n[serve]\non_demand = true\n")
        with daemon_process(config, root) as daemon:
            with gateway_process(config, daemon.address, gw_port) as gateway:
                time.sleep(1.0)
                asyncio.run(measure(f"http://127.0.0.1:{gw_port}", gateway.pid, args.bombs))
    return 0


if __name__ == "__main__":
    sys.exit(main())
