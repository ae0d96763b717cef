"""What the daemon's usage database (lokid.store.usage) costs at a large team's size, in
process, on a real file: 90 days x 1,000 keys x 5 presets x 8 counters (3.6 million
cells), written as the gateway's reports would write them.

Cases:
- ``report``: one GatewayUsage of 4,096 cells (the most one call may carry: 512 keys x 8
  counters), one transaction, median and max of 20 (the daemon does it at most once a
  second, in a worker thread);
- ``Usage``: lokictl usage by key over every day kept, over the last 7 days, and one
  key by day (in a worker thread; one question at a time);
- ``KeyTotals``: each key's tokens today and this month (the gateway asks every 60 s);
- ``purge``: the retention cut from 90 to 30 days (once a day);
and the file's size. Run: ``.venv/bin/python benchmarks/usage_store.py`` (some 30 s and
150 MiB in a temporary directory, removed at the end).
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from datetime import date, timedelta
from typing import Any

from lokid.core.serve import usage as rules
from lokid.store.usage import UsageStore

TODAY = date(2026, 12, 6)
COUNTERS = ("requests", "prompt_tokens", "cached_tokens", "generated_tokens", "wait_ms",
            "engine_ms", "refused_429", "peer_requests")
KEYS, PRESETS, DAYS = 1000, 5, 90


def timed(fn: Any, *args: Any) -> tuple[float, Any]:
    t = time.perf_counter()
    out = fn(*args)
    return (time.perf_counter() - t) * 1000, out


def main() -> None:
    where = tempfile.mkdtemp(prefix="lokid-usage-bench-")
    try:
        store = UsageStore(where)
        t = time.perf_counter()
        for back in range(DAYS):
            day = (TODAY - timedelta(days=back)).isoformat()
            store.add({(day, f"key{k}", f"p{p}", c): 1 for k in range(KEYS)
                       for p in range(PRESETS) for c in COUNTERS})
            store.flush()
        cells = DAYS * KEYS * PRESETS * len(COUNTERS)
        print(f"filled: {cells} cells in {time.perf_counter() - t:.1f} s")
        report = {(TODAY.isoformat(), f"key{k}", "p0", c): 3 for k in range(512)
                  for c in COUNTERS}
        times = []
        for _ in range(20):
            store.add(report)
            ms, _ = timed(store.flush)
            times.append(ms)
        times.sort()
        print(f"report: {len(report)} cells, median {times[10]:.1f} ms, max {times[-1]:.1f} ms")
        for query in ({"by": ["key"]},
                      {"by": ["key"], "since": (TODAY - timedelta(days=6)).isoformat()},
                      {"by": ["day"], "key": "key7"}):
            q = rules.parse_query(query)
            ms, sums = timed(store.sums, q)
            print(f"Usage {query}: {len(rules.answer(q, sums))} rows in {ms:.0f} ms")
        ms, totals = timed(store.key_totals, TODAY)
        print(f"KeyTotals: {len(totals)} keys in {ms:.0f} ms")
        size = os.path.getsize(os.path.join(where, "usage.db")) / 2 ** 20
        print(f"file: {size:.0f} MiB")
        ms, gone = timed(store.purge, rules.oldest_kept(TODAY, 30))
        print(f"purge to 30 days: {gone} cells in {ms:.0f} ms")
        store.close()
    finally:
        shutil.rmtree(where, ignore_errors=True)


if __name__ == "__main__":
    main()
