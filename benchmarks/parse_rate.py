#!/usr/bin/env python3
"""Parsing rate of the request telemetry: lokid.core.telemetry.requestlog.EngineLog.feed on
realistic engine lines, side by side in one run with the load-verdict parser the daemon
already runs on every engine line (lokid.core.telemetry.enginelog.LoadTracker.feed, the
reference) and a bare loop over the same lines (the floor).

Two mixes, both built from the recorded real logs of tests/data/engine-logs/ (llama.cpp
b11434 on CPU and on an H200 at ``-lv 4``, the Vulkan builds; see its README), repeated
to about --lines lines:

- starts: the logs whole, one parser per recorded start as the daemon keeps one per
  start: mostly start-up lines (model metadata, fit, buffers) and slot chatter, few
  request lines;
- serving: only what a long-running engine prints after ``model loaded`` (each log's
  lines from there on), through one parser: mostly request lines, the costly path.

Best of --reps runs of each. The goal is 50,000 lines/s on one core for each mix: exits 1
below it.

    .venv/bin/python benchmarks/parse_rate.py [--lines 200000] [--reps 5]
"""

from __future__ import annotations

import argparse
import re
import sys
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from lokid.core.telemetry.enginelog import LoadTracker  # noqa: E402
from lokid.core.telemetry.requestlog import EngineLog  # noqa: E402

LOGS = ROOT / "tests" / "data" / "engine-logs"
GOAL = 50_000.0   # lines per second, one core
_STAMP = re.compile(r"^(\d+)\.(\d+)\.(\d+)\.(\d+) [A-Z] ")

Start = tuple[list[str], list[float]]   # one start's lines and their times


def recorded() -> list[Start]:
    """Every recorded log, each line with the time its prefix gives (else the last)."""
    out = []
    for path in sorted(LOGS.glob("*.log")):
        lines = path.read_text().splitlines()
        at, times = 1_764_547_200.0, []
        for line in lines:
            m = _STAMP.match(line)
            if m:
                at = (1_764_547_200.0 + int(m[1]) * 60 + int(m[2]) + int(m[3]) / 1e3
                      + int(m[4]) / 1e6)
            times.append(at)
        out.append((lines, times))
    return out


def serving(logs: list[Start]) -> list[Start]:
    """Each log's lines after ``model loaded`` (the requests and their chatter), as one
    long start."""
    lines: list[str] = []
    times: list[float] = []
    for log_lines, log_times in logs:
        loaded = next((i for i, line in enumerate(log_lines) if "model loaded" in line), None)
        if loaded is not None:
            lines += log_lines[loaded + 1:]
            times += log_times[loaded + 1:]
    return [(lines, times)]


def repeat(starts: list[Start], target: int) -> list[Start]:
    per_round = sum(len(lines) for lines, _ in starts)
    rounds = max(1, round(target / per_round))
    if len(starts) == 1:   # one long start: repeat its lines, not the start
        lines, times = starts[0]
        return [(lines * rounds, times * rounds)]
    return starts * rounds


def run_requestlog(starts: list[Start]) -> int:
    found = 0
    for lines, times in starts:
        log = EngineLog()
        feed = log.feed
        for line, at in zip(lines, times, strict=True):
            if feed(line, at) is not None:
                found += 1
        found += len(log.flush(times[-1] if times else 0.0))
    return found


def run_loadtracker(starts: list[Start]) -> int:
    found = 0
    for lines, _ in starts:
        feed = LoadTracker().feed
        for line in lines:
            if feed(line) is not None:
                found += 1
    return found


def run_floor(starts: list[Start]) -> int:
    for lines, times in starts:
        for _line, _at in zip(lines, times, strict=True):
            pass
    return 0


def best(fn: Callable[[list[Start]], int], starts: list[Start], reps: int) -> tuple[float, int]:
    times, found = [], 0
    for _ in range(reps):
        t0 = time.perf_counter()
        found = fn(starts)
        times.append(time.perf_counter() - t0)
    return min(times), found


def request_share(starts: list[Start]) -> float:
    lines = [line for s, _ in starts for line in s]
    hits = sum(1 for line in lines if "| task " in line and (
        "print_timing" in line or "release:" in line or "processing task" in line))
    return hits / len(lines) if lines else 0.0


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--lines", type=int, default=200_000)
    ap.add_argument("--reps", type=int, default=5)
    args = ap.parse_args()

    logs = recorded()
    mixes = {"starts": repeat(logs, args.lines), "serving": repeat(serving(logs), args.lines)}
    ok = True
    print(f"{len(logs)} recorded logs from {LOGS.relative_to(ROOT)}; best of {args.reps}")
    for name, starts in mixes.items():
        n = sum(len(lines) for lines, _ in starts)
        print(f"\n{name}: {n:,} lines in {len(starts)} start(s), "
              f"{request_share(starts):.0%} of them request lines")
        floor_s, _ = best(run_floor, starts, args.reps)
        ref_s, events = best(run_loadtracker, starts, args.reps)
        ours_s, requests = best(run_requestlog, starts, args.reps)
        rate = n / ours_s
        print(f"  bare loop (floor)            {n / floor_s:>12,.0f} lines/s")
        print(f"  enginelog.LoadTracker.feed   {n / ref_s:>12,.0f} lines/s  ({events:,} events)")
        print(f"  requestlog.EngineLog.feed    {rate:>12,.0f} lines/s  ({requests:,} requests)")
        print(f"  EngineLog / LoadTracker time: {ours_s / ref_s:.2f}x; "
              f"{ours_s / n * 1e6:.2f} µs per line; goal {GOAL:,.0f} lines/s: "
              + ("met" if rate >= GOAL else "MISSED"))
        ok = ok and rate >= GOAL
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
