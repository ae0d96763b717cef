#!/usr/bin/env python3
"""The daemon's cost under systemd while an engine serves: lokid.service beside the engine.

In the project's booted Debian container (tests/support/systemd_harness.py, root
needed), lokid installed as the tests install it, one preset of the tiny llama
started as ``loki-engine@tiny``. A client inside the container sends --rate requests
per second (4 tokens generated) for --seconds. Side by side in one run, from
systemd's own accounting (``CPUUsageNSec`` of each unit): lokid.service's CPU, which
reads every engine line from the journal for the Stats, against the engine unit's
(the reference: the work being measured). Then lokid.service's CPU over --idle
seconds with the engine running and no request, and the request count its Stats
property gives (it must equal the replies).

Goals (issue 14): daemon CPU <= 2 % under 50 requests/s, idle <= 0.1 %. Exits 1 when
one is missed.

    .venv/bin/python benchmarks/daemon_load_systemd.py [--rate 50] [--seconds 20] [--idle 20]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT))

LOAD = r'''
import asyncio, sys, time
import httpx

async def main(rate, seconds, port):
    ok = 0
    async with httpx.AsyncClient(timeout=60) as client:
        async def one(i):
            nonlocal ok
            r = await client.post(f"http://127.0.0.1:{port}/v1/chat/completions", json={
                "messages": [{"role": "user", "content": f"Hi {i}"}], "max_tokens": 4,
                "temperature": 0})
            ok += r.status_code == 200
        tasks, start = [], time.perf_counter()
        for i in range(int(rate * seconds)):
            delay = start + i / rate - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(one(i)))
        await asyncio.gather(*tasks)
    print(ok)

asyncio.run(main(float(sys.argv[1]), float(sys.argv[2]), int(sys.argv[3])))
'''


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rate", type=float, default=50)
    ap.add_argument("--seconds", type=float, default=20)
    ap.add_argument("--idle", type=float, default=20)
    args = ap.parse_args()
    from support import REPO
    from support import models as gen
    from support.enginekit import engine_binary
    from support.lokid_install import install, unit
    from support.systemd_harness import Container

    with tempfile.TemporaryDirectory() as tmp:
        model = gen.write_llama(Path(tmp) / "llama.gguf")
        ct = Container(binds={"/opt/lokid": str(REPO),
                              "/opt/engine": os.path.dirname(engine_binary())})
        ct.start()
        try:
            lk = install(ct, "/opt/engine/llama-server", [str(model)])
            port = lk.preset("tiny", 'model = "llama.gguf"\n')
            ct.systemctl("restart", "lokid.service")
            ct.systemctl("start", unit("tiny"), timeout=120)
            ct.write_file("/tmp/load.py", LOAD)

            def cpu(name: str) -> float:
                return int(ct.show(name, "CPUUsageNSec")["CPUUsageNSec"]) / 1e9

            d0, e0, t0 = cpu("lokid.service"), cpu(unit("tiny")), time.monotonic()
            r = ct.run(["python3", "/tmp/load.py", str(args.rate), str(args.seconds),
                        str(port)], timeout=args.seconds * 10 + 60)
            took = time.monotonic() - t0
            daemon = (cpu("lokid.service") - d0) / took * 100
            engine = (cpu(unit("tiny")) - e0) / took * 100
            replies = int(r.stdout.strip())
            time.sleep(2)   # the last lines reach the journal, then the daemon
            stats = json.loads(ct.run(["env", "PYTHONPATH=/opt/lokid", "python3", "-m",
                                       "lokid.ctl", "stats", "tiny", "--json"]).stdout)
            i0, ti = cpu("lokid.service"), time.monotonic()
            time.sleep(args.idle)
            idle = (cpu("lokid.service") - i0) / (time.monotonic() - ti) * 100
        finally:
            ct.stop()

    print(f"load: {replies} replies in {took:.1f} s (asked {args.rate:g}/s); the daemon's "
          f"Stats count {stats.get('requests')} requests")
    print(f"CPU under load: lokid.service {daemon:.2f} %, engine unit {engine:.1f} % "
          f"(ratio daemon/engine {daemon / max(engine, 1e-9):.4f}); goal daemon <= 2 %")
    print(f"idle with the engine running: lokid.service {idle:.3f} % CPU; goal <= 0.1 %")
    ok = daemon <= 2 and idle <= 0.1 and stats.get("requests") == replies
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
