#!/usr/bin/env python3
"""What a peer's listing costs the gateway (issue 45, items 2 and 3): the gateway in a
process of its own (no daemon: its peers only), one peer that lies in another
(tests/support/lyingpeer.py), and a client in this one.

For each mode of the peer (``huge``: 600 MiB; ``many``: 87,000 models, 4 MiB; ``big N``:
N models, the most a listing may hold), after the gateway read it a few times: the
gateway's resident memory (VmRSS, and its peak VmHWM), how many models it lists, then
for ``--seconds``: sequential ``GET /health`` (p50/p99/max) while another client asks
``GET /v1/models`` in a loop beside it (its p50/p99), as a team's clients do.

    .venv/bin/python benchmarks/peer_listing.py [--seconds 10] [--modes huge,many,big]

What it printed here (2 CPUs shared with other work, 2026-12-06, the venv's aiohttp
3.14; before = the tree at a5e34d1, after = issue 45's bounds):

- ``many`` (87,000 models, 3.8 MB): before, /health p99 1,197 ms (26 answered in 10 s
  beside /v1/models at p50 1,034 ms), gateway peak RSS 206 MiB; after, refused by its
  size: /health p99 6.4 ms, /v1/models p50 0.4 ms, 51 MiB;
- ``huge`` (600 MiB): before, read up to the old 4 MiB cap, peak RSS 76 MiB; after,
  refused by its Content-Length before any byte, 51 MiB;
- ``big 256`` (the most allowed): /v1/models p50 1.7–3.9 ms and /health p99 5–13 ms
  beside it, before and after alike (the machine's noise is of that size); 1,024
  models cost /v1/models 7.8 ms and /health p99 37 ms, hence the bound of 256.
"""

from __future__ import annotations

import argparse
import asyncio
import http.client
import json
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from support.daemonkit import private_bus  # noqa: E402
from support.enginekit import free_port  # noqa: E402
from support.lyingpeer import lying_peer  # noqa: E402


def serve(bus: str, port: int, peer: str) -> None:
    """The child: the gateway with one peer until killed."""
    from support.gatewaykit import gateway_on

    from lokid.core.fleet.peers import Peer

    async def main() -> None:
        async with gateway_on(bus, port=port, peers=(Peer("liar", peer),)):
            await asyncio.Event().wait()

    asyncio.run(main())


def status(pid: int) -> dict[str, int]:
    out = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            out[key] = int(value.split()[0]) // 1024
    return out


def timed(port: int, path: str, seconds: float) -> dict[str, float]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    took: list[float] = []
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        t0 = time.perf_counter()
        conn.request("GET", path)
        conn.getresponse().read()
        took.append((time.perf_counter() - t0) * 1000)
    took.sort()
    return {"n": len(took), "p50_ms": round(statistics.median(took), 2),
            "p99_ms": round(took[int(len(took) * 0.99) - 1], 2), "max_ms": round(took[-1], 2)}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--serve", nargs=3, metavar=("BUS", "PORT", "PEER"))
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--modes", default="huge,many,big")
    args = ap.parse_args()
    if args.serve:
        serve(args.serve[0], int(args.serve[1]), args.serve[2])
        return 0
    with tempfile.TemporaryDirectory() as tmp, private_bus(Path(tmp)) as bus:
        for mode in args.modes.split(","):
            with lying_peer(Path(tmp), *mode.split()) as peer:
                port = free_port()
                child = subprocess.Popen([sys.executable, __file__, "--serve", bus, str(port),
                                          peer.url])
                try:
                    time.sleep(3)
                    before = status(child.pid)
                    time.sleep(8)   # a few reads of the peer
                    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
                    conn.request("GET", "/v1/models")
                    listed = json.loads(conn.getresponse().read())["data"]
                    after = status(child.pid)
                    beside: dict[str, dict[str, float]] = {}
                    thread = threading.Thread(target=lambda b=beside, p=port: b.update(
                        v1_models=timed(p, "/v1/models", args.seconds)))
                    thread.start()
                    health = timed(port, "/health", args.seconds)
                    thread.join()
                    print(json.dumps({
                        "mode": mode, "rss_mib_at_3s": before, "rss_mib_at_11s": after,
                        "models_listed": len(listed), "health": health, **beside,
                        "rss_mib_end": status(child.pid)}), flush=True)
                finally:
                    child.terminate()
                    child.wait(10)
    return 0


if __name__ == "__main__":
    sys.exit(main())
