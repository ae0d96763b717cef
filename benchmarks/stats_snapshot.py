#!/usr/bin/env python3
"""The cost of one preset's Stats at a steady 50 requests/s: a snapshot of a running start
against a recount of its 5-minute window, side by side.

A start that has served 50 requests/s for 10 minutes holds 15,000 requests in its
5-minute window. The daemon computes that preset's Stats at each D-Bus Get and at
each PropertiesChanged (≤ 1/s). lokid's :class:`lokid.core.telemetry.figures.StartStats`
keeps the windows' sums and sorted speeds as requests come and go, so a snapshot
costs what expired since the last one; the reference is a recount of the same
window (:func:`lokid.core.telemetry.figures.summarize`, what a snapshot cost before:
a pass over every request held, and a sort for the percentiles). Also: the cost of
adding one request. Prints both and the ratio.

    .venv/bin/python benchmarks/stats_snapshot.py [--rate 50] [--minutes 10]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from lokid.core.telemetry.figures import WINDOW, StartStats, summarize  # noqa: E402
from lokid.core.telemetry.requestlog import Request  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rate", type=float, default=50)
    ap.add_argument("--minutes", type=float, default=10)
    args = ap.parse_args()
    t0 = 1_764_547_200.0
    n = int(args.rate * args.minutes * 60)
    requests = [Request(i % 4, i, 40 + i % 17, 5.0 + i % 7 * 0.25, 4 + i % 5,
                        20.0 + i % 11 * 0.5, t0 + i / args.rate, i % 3 or None,
                        4 if i % 3 else None, 1.5 if i % 3 else None) for i in range(n)]
    stats = StartStats(t0, "ngram")
    a0 = time.perf_counter()
    for r in requests:
        stats.add(r)
    add_us = (time.perf_counter() - a0) / n * 1e6
    end = requests[-1].at
    held = [r for r in requests if r.at >= end - WINDOW]

    def per_call(fn, reps: int) -> float:  # type: ignore[no-untyped-def]
        best = float("inf")
        for _ in range(5):
            s0 = time.perf_counter()
            for i in range(reps):
                fn(i)
            best = min(best, (time.perf_counter() - s0) / reps)
        return best * 1000

    live = per_call(lambda i: stats.snapshot(end + i * 1e-6), 200)
    recount = per_call(lambda i: summarize(held, end - WINDOW, end + i * 1e-6, "ngram"), 5)
    print(f"{n} requests at {args.rate:g}/s over {args.minutes:g} min; "
          f"{stats.held} in the 5-minute window")
    print(f"add one request: {add_us:.1f} µs")
    print(f"Stats of a running start: {live:.3f} ms; recount of its window "
          f"(the reference): {recount:.2f} ms; ratio {live / recount:.4f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
