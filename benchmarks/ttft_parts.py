#!/usr/bin/env python3
"""Where the time to first token goes with 16 simultaneous streams through the gateway
(issue 47, item 3): the gateway run under :mod:`trace_gateway` (timestamps at each step
of a request's path, on the client's clock), the same bursts of 16 streams sent
directly and through it, interleaved, ``--rounds`` times.

Printed, medians over every stream of every round, in ms from the moment its client
began sending it:

- direct: the first token; through the gateway: when its handler ran (``in``), its body
  read, model found, turn, slot, connection to the engine made, request written, the
  engine's first bytes read, the first part carried, and the client's first token;
- the gateway's CPU a request (``/proc``, over its rounds) and the burst's spread: the
  last request's ``in`` less the first's (how long the gateway took to take them all).

Measured (issue 47, item 3), --rounds 10, the code before (5afecea) and after (beb3061)
side by side, this same script, 5 runs each in alternate order, load 3-13 (other helpers'
tests). The two runs each at load 3-4, before: direct's first token p50 22.9 and 21.2 ms,
the gateway's +10.3 and +10.5 ms; its body read +2.06 and +1.86 ms (asyncio.wait_for's
task, two turns of the loop behind every other request's steps), its connect +3.5 and
+3.2 ms (waiting for the other 15 requests' steps), the engine's first bytes to the first
part carried +4.2 and +4.1 ms; the burst all sent 8.3 and 8.7 ms after its first request
came in, the gateway's CPU 312 and 306 us a request meanwhile. After: +4.1 and +13.1 ms;
the body read +0.04 ms; all sent 7.6 and 10.1 ms after the first came in; 273 and 287 us
a request. Over the 5 runs: added first token +10.3 to +26.7 ms before (median +21.1),
+4.1 to +13.1 after (median +10.9); CPU a request 306-394 us before (median 349), 264-362
after (median 278). From a request's handler to its connect, after: 35 us to its body
(the middlewares, its key and host, the read), 21 to its model, 18 to its turn, 9 to its
slot, 13 to the connect; the connect itself is 15-18 us of CPU (uvloop, timed in
process). What is left: every request of a burst waits for its connect while the gateway
does the other 15's work, ~280 us each, so the engine gets them together some 4-5 ms
after the client sent them; the rest of the spread is the engine's batching. 91-97 % of
the engine's reads are one whole chunk (carried as they are).

    .venv/bin/python benchmarks/ttft_parts.py [--rounds 10] [--tokens 64] [--profile FILE]
                                              [--spy FILE]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import aiohttp  # noqa: E402
from gateway_latency import gateway_process  # noqa: E402
from support.daemonproc import daemon_process  # noqa: E402
from support.enginekit import free_port, tiny_config  # noqa: E402
from support.openai_load import STREAMS, chat, cpu_seconds  # noqa: E402

PRESET = "tiny"
Record = dict[str, Any]   # a stream's times (its client's, or the gateway's trace)
STEPS = ("in", "body", "scan", "turn", "gate", "opening", "connect", "sent", "head", "first", "out")


async def stream(session: aiohttp.ClientSession, url: str, tokens: int, trace: str,
                 model: str | None) -> Record:
    t = time.perf_counter_ns()
    first = 0
    async with session.post(url + "/v1/chat/completions", json=chat(tokens, True, model),
                            headers={"X-Trace": trace}) as r:
        assert r.status == 200, r.status
        async for line in r.content:
            if not first and line.startswith(b"data: {"):
                delta = json.loads(line[6:])["choices"]
                if delta and delta[0]["delta"].get("content") is not None:
                    first = time.perf_counter_ns()
    return {"id": trace, "send": t, "token": first}


async def burst(session: aiohttp.ClientSession, url: str, tokens: int, tag: str,
                model: str | None) -> list[Record]:
    return list(await asyncio.gather(*(stream(session, url, tokens, f"{tag}-{i}", model)
                                       for i in range(STREAMS))))


async def measure(direct: str, gateway: str, rounds: int, tokens: int, pid: int
                  ) -> tuple[list[Record], list[Record], float]:
    got_direct: list[Record] = []
    got_gateway: list[Record] = []
    cpu = 0.0
    async with aiohttp.ClientSession() as session:
        for i in range(3):   # the preset started, both paths warm
            await burst(session, gateway, tokens, f"warm-g{i}", PRESET)
            await burst(session, direct, tokens, f"warm-d{i}", None)
        for i in range(rounds):
            order = [("direct", direct), ("gateway", gateway)]
            if i % 2:
                order.reverse()   # varied order: neither side always after the other
            for name, url in order:
                before = cpu_seconds(pid)
                got = await burst(session, url, tokens, f"{name}{i}",
                                  PRESET if name == "gateway" else None)
                if name == "gateway":
                    cpu += cpu_seconds(pid) - before
                    got_gateway += got
                else:
                    got_direct += got
    return got_direct, got_gateway, cpu


def report(direct: list[Record], gateway: list[Record],
           traces: dict[str, Record], cpu: float, rounds: int) -> None:
    def ms(ns: float) -> float:
        return ns / 1e6

    d = [ms(r["token"] - r["send"]) for r in direct]
    g = [ms(r["token"] - r["send"]) for r in gateway]
    print(f"{len(d)} streams direct, {len(g)} through the gateway, {rounds} rounds:")
    print(f"  direct   first token p50 {statistics.median(d):7.2f} ms")
    print(f"  gateway  first token p50 {statistics.median(g):7.2f} ms   (added "
          f"{statistics.median(g) - statistics.median(d):+.2f} ms)")
    print("  through the gateway, from the client's send, p50 (and the step's own p50):")
    previous: str | None = None
    for step in STEPS:
        at = [ms(traces[r["id"]][step] - r["send"]) for r in gateway
              if step in traces.get(r["id"], {})]
        own = [ms(traces[r["id"]][step] - traces[r["id"]][previous]) for r in gateway
               if step in traces.get(r["id"], {}) and previous in traces[r["id"]]] \
            if previous else at
        spent = [ms(traces[r["id"]]["cpu_" + step] - traces[r["id"]]["cpu_" + previous])
               for r in gateway if "cpu_" + step in traces.get(r["id"], {})
               and "cpu_" + str(previous) in traces[r["id"]]] if previous else []
        if at:
            print(f"    {step:8} {statistics.median(at):7.2f} ms   (+{statistics.median(own):.3f})"
                  + (f"   CPU +{statistics.median(spent) * 1000:.0f} us" if spent and step in
                     ("body", "scan", "turn", "gate", "opening") else ""))
        previous = step
    first_out = [ms(r["token"] - traces[r["id"]]["first"]) for r in gateway
                 if "first" in traces.get(r["id"], {})]
    print(f"    client's token after the gateway's first part: p50 "
          f"{statistics.median(first_out):.2f} ms")
    spreads = []
    for i in range(rounds):
        mine = [traces[r["id"]] for r in gateway
                if r["id"].startswith(f"gateway{i}-") and "sent" in traces.get(r["id"], {})]
        sends = [r["send"] for r in gateway if r["id"].startswith(f"gateway{i}-")]
        if len(mine) == STREAMS:
            spreads.append((ms(max(t["in"] for t in mine) - min(t["in"] for t in mine)),
                            ms(max(sends) - min(sends)),
                            ms(max(t["sent"] for t in mine) - min(t["in"] for t in mine)),
                            ms(max(t["sent"] for t in mine) - min(t["sent"] for t in mine)),
                            ms(max(t["cpu_sent"] for t in mine) - min(t["cpu_in"] for t in mine))))
    if spreads:
        def p50(k: int) -> float:
            return statistics.median(s[k] for s in spreads)
        print(f"  a burst of {STREAMS}, p50 of {len(spreads)}: the client sent them over "
              f"{p50(1):.2f} ms, the gateway took them in over {p50(0):.2f} ms and had them "
              f"all sent {p50(2):.2f} ms after the first came in (sent over {p50(3):.2f} ms); "
              f"its CPU meanwhile {p50(4):.2f} ms, {p50(4) * 1000 / STREAMS:.0f} us a request")
    n = rounds * STREAMS
    print(f"  the gateway's CPU over its rounds: {cpu * 1000 / n:.2f} ms a stream "
          f"(all of it, relaying included)")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument("--rounds", type=int, default=10)
    p.add_argument("--tokens", type=int, default=64)
    p.add_argument("--profile", default="", help="a cProfile of the gateway, to this file")
    p.add_argument("--spy", default="", help="py-spy's samples of the gateway (collapsed "
                   "stacks, --native) over the measured rounds, to this file")
    args = p.parse_args()
    with tempfile.TemporaryDirectory(prefix="lokid-ttft-") as tmp:
        root = Path(tmp)
        port, gw_port = free_port(), free_port()
        config = tiny_config(root, PRESET, f'port = {port}\nextra_args = ["-np", "{STREAMS}"]\n'
                             "[serve]\non_demand = true\n")
        trace_file = root / "trace.jsonl"
        os.environ["LOKID_TRACE"] = str(trace_file)
        if args.profile:
            os.environ["LOKID_PROFILE"] = str(Path(args.profile).resolve())
        with daemon_process(config, root) as daemon:
            with gateway_process(config, daemon.address, gw_port,
                                 head=(sys.executable, str(ROOT / "benchmarks" /
                                                           "trace_gateway.py"))) as gw:
                print(f"load average at start: {os.getloadavg()[0]:.2f}, {os.cpu_count()} CPUs")
                spy = subprocess.Popen(
                    [str(Path(sys.executable).parent / "py-spy"), "record", "--native", "-r",
                     "500", "-f", "raw", "-o", args.spy, "--pid", str(gw.pid)],
                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) if args.spy else None
                direct, gateway, cpu = asyncio.run(measure(
                    f"http://127.0.0.1:{port}", f"http://127.0.0.1:{gw_port}", args.rounds,
                    args.tokens, gw.pid))
                if spy is not None:
                    spy.send_signal(signal.SIGINT)
                    spy.wait(60)
        traces = {}
        for line in trace_file.read_text().splitlines():
            record = json.loads(line)
            traces[record.pop("id")] = record
        chunks = traces.pop("_chunks", {})
        report(direct, gateway, traces, cpu, args.rounds)
        if chunks.get("reads"):
            print(f"  the streams' reads from the engine: {chunks['reads']}, "
                  f"{chunks['one'] / chunks['reads']:.1%} of them one whole chunk")
        print(f"load average at end: {os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
