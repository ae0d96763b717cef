#!/usr/bin/env python3
"""Replicas under a rising, then falling load (issue 47, item 1): does the gateway's
scaling rule (:mod:`lokid.core.serve.scaling`) start a replica only when the wait pays for its
load, stop it once idle, and never thrash, and only where the replica gets compute of
its own? Each side a fresh lokid host (private bus, ``lokid daemon`` local runner,
``lokid gateway``), in a seeded random order:

- **scaling**: ``max_replicas = 3`` (one engine at first; the rule starts and stops);
- **fixed 1**: one engine (what lokid did before issue 47);
- **fixed 2**, **fixed 3**: ``replicas = 2`` or ``3``, all from the start (the most
  memory, the rule's best case for waits).

Each engine is the generated tiny llama with one slot (``-np 1``), so that requests wait
at the preset's gate as soon as two are in flight, and ``--threads`` threads (``-t``; 0:
llama-server's default, one per physical core). The load is closed-loop clients, their
number changing by phase (``--clients``, default 1, 2, 4, 8, 8, 4, 2, 1, 0), each phase
``--phase`` seconds; the preset's ``idle_stop`` is ``--idle-stop`` (the rule stops a
replica it started after a quarter of it without a request).

Printed per side and phase: requests, failures, answer p50/p95, and the engines ready on
average (sampled from the gateway's ``/v1/models`` every 0.25 s); per side: replica starts
and stops (and per minute), engine-seconds (the memory the side held, in engines x
seconds) and the answer p95 over the whole run; the requests answered in the busiest
phases, side by side. Verdict lines (with scaling, fixed 1 and fixed 3): scaling's
engine-seconds against fixed 3's, its p95 against fixed 1's, and whether any replica was
started and stopped again within ``--thrash`` seconds (a thrash).

Measured on 2 CPUs (2 physical cores), ``--phase 15``, the tiny model's 48-token answers:

- ``--threads 1 --sides "scaling,fixed 1,fixed 2" --seed 55`` (load 0.4 at the start;
  run fixed 1, fixed 2, scaling): the rule started replica 2 at 45.6 s, as the first
  8-client phase began (a wait passed a replica's load), held 1.97-2.00 engines through
  the load and stopped it at 130.5 s, 10 s into the idle phase (idle_stop / 4); it did
  not start replica 3 (two engines of one thread take both cores): 1 start, 1 stop, 0
  thrashes, 0 failed, 220 engine-seconds against fixed 2's 270 and fixed 1's 135. The
  8-client phases answered 5,664 requests (scaling), 5,017 (fixed 2) and 3,438 (fixed 1):
  1.65 x and 1.46 x one engine, below the issue's 1.8 x: the gateway, the clients and
  the daemon run on the same two cores. Answer p95 there 63-64 ms against fixed 1's
  98-119.
- default threads, ``--sides "scaling,fixed 1" --seed 56`` (load 0.5; run fixed 1,
  scaling): each engine takes both cores, so the rule starts nothing (a replica would
  share the CPU with its one running engine of 2 threads): 0 starts, 135
  engine-seconds as fixed 1's; 4,409 and 4,245 requests in the 8-client phases (within
  noise of each other).
- Before the rule weighed compute (3b13785, ``--phase 20 --seed 47``, default threads,
  fixed 3 beside): it started replicas 2 and 3 at the 8-client phase, and with three
  engines on two cores that phase answered 212 requests instead of 2,725 (p95 1,610 ms
  against 70); fixed 3 was as slow all along.

    .venv/bin/python benchmarks/replicas_rising.py [--phase 30] [--clients 1,2,4,8,8,4,2,1,0]
        [--tokens 48] [--idle-stop 40] [--thrash 10] [--seed N] [--sides scaling,...]
        [--threads N]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import aiohttp  # noqa: E402
from gateway_latency import gateway_process  # noqa: E402
from support.daemonproc import daemon_process  # noqa: E402
from support.enginekit import engine_binary, free_port, write_config, write_preset  # noqa: E402
from support.models import write_llama  # noqa: E402
from support.openai_load import pct  # noqa: E402

from lokid.host.cores import host_cores  # noqa: E402

PRESET = "r"
SIDES = {"scaling": "max_replicas = 3", "fixed 1": "max_replicas = 1",
         "fixed 2": "replicas = 2", "fixed 3": "replicas = 3"}
SAMPLE = 0.25   # s between two looks at the engines' states


@dataclass
class Phase:
    clients: int
    times: list[float] = field(default_factory=list)
    failed: int = 0
    ready: list[int] = field(default_factory=list)   # engines ready, each sample


@dataclass
class Run:
    phases: list[Phase]
    starts: list[tuple[float, int]] = field(default_factory=list)   # (when, index)
    stops: list[tuple[float, int]] = field(default_factory=list)
    engine_seconds: float = 0.0
    seconds: float = 0.0


def host(root: Path, serve: str, idle_stop: int, threads: int) -> Path:
    root.mkdir()
    (root / "models").mkdir()
    write_llama(root / "models" / "long.gguf", context_length=8192)
    t = f', "-t", "{threads}"' if threads > 0 else ""
    config = write_config(root, engine_binary(), [root / "models"])
    write_preset(config, PRESET, f'model = "long.gguf"\nctx = 8192\nport = {free_port()}\n'
                 f'extra_args = ["-np", "1"{t}]\n[serve]\n{serve}\non_demand = true\n'
                 f'idle_stop = "{idle_stop}s"\n')
    return config


async def engines(session: aiohttp.ClientSession, url: str) -> dict[int, str]:
    async with session.get(f"{url}/v1/models/{PRESET}") as r:
        facts = (await r.json()).get("lokid", {})
    return {int(e["index"]): str(e["state"]) for e in facts.get("engines", ())} \
        or {1: str(facts.get("state", ""))}


async def run_side(url: str, plan: list[int], phase_s: float, tokens: int) -> Run:
    run = Run([Phase(n) for n in plan])
    current = [0]
    begun = time.monotonic()

    async def client(session: aiohttp.ClientSession, k: int) -> None:
        n = 0
        while current[0] < len(plan):
            p = run.phases[current[0]]
            if k >= p.clients:
                await asyncio.sleep(0.05)
                continue
            n += 1
            t = time.perf_counter()
            try:
                async with session.post(url + "/v1/chat/completions", json={
                        "model": PRESET, "max_tokens": tokens, "temperature": 0,
                        "ignore_eos": True,   # the tiny model's answers end at once else
                        "messages": [{"role": "user", "content": f"Client {k} asks {n}."}]}) as r:
                    await r.read()
                    ok = r.status == 200
            except aiohttp.ClientError:
                ok = False
            if ok:
                p.times.append(time.perf_counter() - t)
            else:
                p.failed += 1

    async def watch(session: aiohttp.ClientSession) -> None:
        last: dict[int, str] = {}
        at = time.monotonic()
        while current[0] < len(plan):
            states = await engines(session, url)
            now = time.monotonic()
            for k, s in states.items():
                was = last.get(k, "inactive")
                if k > 1 and s == "ready" and was != "ready":
                    run.starts.append((now - begun, k))
                if k > 1 and was == "ready" and s != "ready":
                    run.stops.append((now - begun, k))
            ready = sum(1 for s in states.values() if s == "ready")
            run.phases[current[0]].ready.append(ready)
            run.engine_seconds += ready * (now - at)
            last, at = states, now
            await asyncio.sleep(SAMPLE)

    timeout = aiohttp.ClientTimeout(total=600)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        tasks = [asyncio.create_task(client(session, k)) for k in range(max(plan))]
        tasks.append(asyncio.create_task(watch(session)))
        for i in range(len(plan)):
            current[0] = i
            await asyncio.sleep(phase_s)
        current[0] = len(plan)
        await asyncio.gather(*tasks)
    run.seconds = time.monotonic() - begun
    return run


async def warm(url: str) -> None:
    """The preset's engines started and ready (the first request starts it)."""
    async with aiohttp.ClientSession() as session:
        async with session.post(url + "/v1/chat/completions", json={
                "model": PRESET, "max_tokens": 1,
                "messages": [{"role": "user", "content": "Hi"}]}) as r:
            assert r.status == 200, await r.text()


def thrashes(run: Run, within: float) -> int:
    """Replicas stopped less than ``within`` s after their start, or started again less
    than ``within`` s after their stop."""
    events = sorted([(t, k, "start") for t, k in run.starts] +
                    [(t, k, "stop") for t, k in run.stops])
    count = 0
    for (t1, k1, e1), (t2, k2, e2) in zip(events, events[1:], strict=False):
        if k1 == k2 and e1 != e2 and t2 - t1 < within:
            count += 1
    return count


def report(name: str, run: Run, thrash: float) -> None:
    print(f"\n{name}: {run.seconds:.0f} s, {len(run.starts)} replica starts, "
          f"{len(run.stops)} stops ({(len(run.starts) + len(run.stops)) / run.seconds * 60:.1f}"
          f" a minute), {run.engine_seconds:.0f} engine-seconds, "
          f"{thrashes(run, thrash)} thrashes (< {thrash:g} s)")
    print(f"  {'clients':>7} {'requests':>8} {'failed':>6} {'p50 ms':>8} {'p95 ms':>8} "
          f"{'engines':>7}")
    for p in run.phases:
        engines_ready = sum(p.ready) / max(1, len(p.ready))
        p50 = pct(p.times, 50) * 1e3 if p.times else 0.0
        p95 = pct(p.times, 95) * 1e3 if p.times else 0.0
        print(f"  {p.clients:7d} {len(p.times):8d} {p.failed:6d} {p50:8.0f} {p95:8.0f} "
              f"{engines_ready:7.2f}")
    for t, k in run.starts:
        print(f"  replica {k} ready at {t:.1f} s")
    for t, k in run.stops:
        print(f"  replica {k} stopped at {t:.1f} s")


def whole_p95(run: Run) -> float:
    return pct([t for p in run.phases for t in p.times], 95)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument("--phase", type=float, default=30.0, help="seconds a phase")
    p.add_argument("--clients", default="1,2,4,8,8,4,2,1,0")
    p.add_argument("--tokens", type=int, default=48, help="tokens of each answer")
    p.add_argument("--idle-stop", type=int, default=40, help="the preset's idle_stop, s")
    p.add_argument("--thrash", type=float, default=10.0)
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--sides", default="scaling,fixed 1,fixed 3")
    p.add_argument("--threads", type=int, default=0,
                   help="each engine's -t (0: the engine's default, every core)")
    args = p.parse_args()
    plan = [int(x) for x in args.clients.split(",")]
    chosen = [s.strip() for s in args.sides.split(",")]
    if not set(chosen) <= set(SIDES) or not plan or min(plan) < 0:
        p.error(f"--sides: of {', '.join(SIDES)}; --clients: counts >= 0")
    seed = args.seed if args.seed is not None else random.randrange(1_000_000)
    order = list(chosen)
    random.Random(seed).shuffle(order)
    print(f"load average at start: {os.getloadavg()[0]:.2f}, {os.cpu_count()} CPUs; seed "
          f"{seed}; sides in the order run: {', '.join(order)}; phases of {args.phase:g} s "
          f"with {args.clients} clients; answers of {args.tokens} tokens; idle_stop "
          f"{args.idle_stop} s; engine threads "
          f"{args.threads or 'the default (every core)'}; {host_cores()} physical cores")
    runs: dict[str, Run] = {}
    with tempfile.TemporaryDirectory(prefix="lokid-replicas-bench-") as tmp:
        for i, side in enumerate(order):
            root = Path(tmp) / f"side{i}"
            root.mkdir()
            config = host(root / "host", SIDES[side], args.idle_stop, args.threads)
            port = free_port()
            url = f"http://127.0.0.1:{port}"
            with daemon_process(config, root) as daemon, \
                    gateway_process(config, daemon.address, port):
                asyncio.run(warm(url))
                if side.startswith("fixed") and side != "fixed 1":   # ready before the load
                    asyncio.run(_all_ready(url, int(side.split()[1])))
                runs[side] = asyncio.run(run_side(url, plan, args.phase, args.tokens))
            print(f"  {side}: done, load {os.getloadavg()[0]:.2f}")
    for side in (s for s in SIDES if s in runs):
        report(side, runs[side], args.thrash)
    failed = sum(p.failed for r in runs.values() for p in r.phases)
    most = max(plan)
    busiest = {side: sum(len(p.times) for p in r.phases if p.clients == most)
               for side, r in runs.items()}
    print(f"\nrequests answered in the {most}-client phases: " + ", ".join(
        f"{side} {n}" for side, n in busiest.items()))
    if {"scaling", "fixed 1", "fixed 3"} <= set(runs):
        s, one, three = runs["scaling"], runs["fixed 1"], runs["fixed 3"]
        print(f"\nscaling: {s.engine_seconds / max(1.0, three.engine_seconds):.2f} x fixed 3's "
              f"engine-seconds, {s.engine_seconds / max(1.0, one.engine_seconds):.2f} x fixed "
              f"1's; answer p95 {whole_p95(s) * 1e3:.0f} ms against fixed 1's "
              f"{whole_p95(one) * 1e3:.0f} and fixed 3's {whole_p95(three) * 1e3:.0f} "
              f"({os.cpu_count()} CPUs: the engines share them); thrashes "
              f"{thrashes(s, args.thrash)}; failed requests {failed}")
    return 0 if failed == 0 else 1


async def _all_ready(url: str, count: int) -> None:
    async with aiohttp.ClientSession() as session:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            states = await engines(session, url)
            if sum(1 for s in states.values() if s == "ready") >= count:
                return
            await asyncio.sleep(0.2)
    raise SystemExit(f"not {count} engines ready in 120 s")


if __name__ == "__main__":
    sys.exit(main())
