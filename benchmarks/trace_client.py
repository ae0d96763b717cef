#!/usr/bin/env python3
"""Replay a trace of requests on one OpenAI endpoint, open loop: each request is sent at
its own time whatever the others do (the arrivals of many users, not a few clients
waiting for their answers), as benchmarks/placement_sim.py replays its traces.

Copied into the system under test and run there with its own python3 (the standard
library only). ``--trace FILE``: a JSON list of ``[at, model, max_tokens]`` (seconds from
the start). Each request is a chat completion on a connection of its own; it is recorded
with its model, when it was sent, its status, how long it took, the engine's own time
for it (``service``: its ``timings``, prompt and generation) and the error's words where
it failed. The records go to ``--out`` as JSON.

    python3 trace_client.py --port 8000 --trace trace.json --out records.json
"""

from __future__ import annotations

import argparse
import http.client
import json
import threading
import time
from typing import Any


def one(port: int, model: str, tokens: int, timeout: float) -> dict[str, Any]:
    body = json.dumps({"model": model, "max_tokens": tokens, "temperature": 0,
                       "messages": [{"role": "user", "content": "Tell me a story"}]})
    t0 = time.monotonic()
    record: dict[str, Any] = {"model": model, "status": 0}
    try:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
        conn.request("POST", "/v1/chat/completions", body,
                     {"Content-Type": "application/json"})
        r = conn.getresponse()
        data = r.read()
        record["status"] = r.status
        if r.status == 200:   # the engine's own time for it: its service, waits left out
            try:
                timings = json.loads(data)["timings"]
                record["service"] = (timings["prompt_ms"] + timings["predicted_ms"]) / 1000
            except (ValueError, KeyError, TypeError):
                pass
        else:
            try:
                record["error"] = json.loads(data)["error"]["message"][:300]
            except (ValueError, KeyError, TypeError):
                record["error"] = data[:300].decode("utf-8", "replace")
        conn.close()
    except (OSError, http.client.HTTPException) as e:
        record["error"] = f"{type(e).__name__}: {e}"[:300]
    record["took"] = time.monotonic() - t0
    return record


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--trace", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--timeout", type=float, default=900.0)
    args = ap.parse_args()
    with open(args.trace, encoding="utf-8") as f:
        trace = json.load(f)
    records: list[dict[str, Any]] = [{} for _ in trace]
    threads = []
    t0 = time.monotonic()
    for i, (at, model, tokens) in enumerate(trace):
        delay = t0 + float(at) - time.monotonic()
        if delay > 0:
            time.sleep(delay)

        def run(i: int = i, model: str = model, tokens: int = tokens, at: float = at) -> None:
            records[i] = {"at": at, "sent": time.monotonic() - t0,
                          **one(args.port, model, int(tokens), args.timeout)}
        t = threading.Thread(target=run, daemon=True)
        t.start()
        threads.append(t)
    for t in threads:
        t.join(args.timeout)
    with open(args.out, "w", encoding="utf-8") as f:
        json.dump({"seconds": time.monotonic() - t0, "records": records}, f)
    failed = sum(1 for r in records if r.get("status") != 200)
    print(f"{len(records)} requests, {failed} failed, {time.monotonic() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
