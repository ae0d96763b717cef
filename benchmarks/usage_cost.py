"""What usage and the audit record (lokid.gateway.usage, .figures, .audit) cost a request,
in process, on answers shaped as the real engine's (llama-server b11434).

Cases, each the best of 5 means over N runs (µs):
- ``figures whole chat``: :func:`figures_of` on a whole chat answer (~1 KiB, timings at
  its end), what the middleware does for every whole answer;
- ``figures embeddings 1024``: the same on an embeddings answer of 1024 floats (~21 KiB,
  usage only), beside ``json.loads`` of it (what reading it whole would cost);
- ``tail per event``: :meth:`Tail.feed` of one streamed event (~330 bytes, llama-server's
  size per token), and ``tail end``: :meth:`Tail.figures` at a 200-event stream's end;
- ``count``: :meth:`Usage.count` of one request (the dict of its day, key and preset);
- ``ended, no journal``: :meth:`Usage.ended` whole (figures, count, hooks, audit record
  built and dropped: a gateway whose stderr is not the journal);
- ``ended + journal.send``: the same with systemd-python's ``journal.send`` to a real
  systemd-journald (a private one, tests/support/journald.py; run as root), what a
  gateway under systemd spends per request.
Run: ``sudo .venv/bin/python benchmarks/usage_cost.py`` (from the repository's root).
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from typing import Any

from aiohttp.test_utils import make_mocked_request

from lokid.core.serve.keys import Identity
from lokid.gateway.audit import Audit
from lokid.gateway.context import IDENTITY_KEY, ROUTE_KEY, WAITED_KEY, WHERE_KEY
from lokid.gateway.figures import Tail, figures_of
from lokid.gateway.report import PRESET_KEY
from lokid.gateway.usage import Usage

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests"))

TIMINGS = {"cache_n": 4, "prompt_n": 13, "prompt_ms": 0.449, "prompt_per_token_ms": 0.0345,
           "prompt_per_second": 28953.2, "predicted_n": 300, "predicted_ms": 1497.22,
           "predicted_per_token_ms": 5.007, "predicted_per_second": 199.7}
CHAT = json.dumps({"choices": [{"finish_reason": "stop", "index": 0, "message": {
    "role": "assistant", "content": "word " * 120}}], "created": 1796600579, "model": "alpha",
    "system_fingerprint": "b11434-unknown", "object": "chat.completion",
    "usage": {"completion_tokens": 300, "prompt_tokens": 17, "total_tokens": 317,
              "prompt_tokens_details": {"cached_tokens": 4}},
    "id": "chatcmpl-ag2Lc6bWfTCkCB4HhZ5nYgUsuwDRMYfX", "timings": TIMINGS}).encode()
EMBED = json.dumps({"model": "beta", "object": "list", "usage": {"prompt_tokens": 9,
                    "total_tokens": 9}, "data": [{"embedding": [0.0123456789012345] * 1024,
                                                  "index": 0, "object": "embedding"}]}).encode()
EVENT = b"data: " + json.dumps({"choices": [{"finish_reason": None, "index": 0, "delta": {
    "content": "word"}}], "created": 1796600579, "id": "chatcmpl-ag2Lc6bWfTCkCB4HhZ5nYgUsuwDRM",
    "model": "alpha", "system_fingerprint": "b11434-unknown",
    "object": "chat.completion.chunk"}).encode() + b"\n\n"
LAST = b"data: " + json.dumps({"choices": [{"finish_reason": "stop", "index": 0,
                                            "delta": {}}], "timings": TIMINGS}).encode() + \
    b"\n\n" + b"data: [DONE]\n\n"


def timed(n: int, fn: Any, rounds: int = 5) -> float:
    """The best of ``rounds`` means (µs): a shared machine's other loads only add."""
    best = float("inf")
    for _ in range(rounds):
        start = time.perf_counter()
        for _ in range(n):
            fn()
        best = min(best, (time.perf_counter() - start) / n * 1e6)
    return best


def request() -> Any:
    r = make_mocked_request("POST", "/v1/chat/completions")
    r[IDENTITY_KEY] = Identity("alice")
    r[ROUTE_KEY] = "/v1/chat/completions"
    r[PRESET_KEY] = "alpha"
    r[WHERE_KEY] = "local"
    r[WAITED_KEY] = 0.0
    return r


async def ended_cost(usage: Usage, n: int, rounds: int = 5) -> float:
    from aiohttp import web

    response = web.Response(body=CHAT, content_type="application/json")
    best = float("inf")
    for _ in range(rounds):
        reqs = [request() for _ in range(n)]
        start = time.perf_counter()
        for r in reqs:
            usage.ended(r, response, 200)
        best = min(best, (time.perf_counter() - start) / n * 1e6)
    return best


def main() -> None:
    n = 20000
    print(f"figures whole chat ({len(CHAT)} B): {timed(n, lambda: figures_of(CHAT)):.2f} µs")
    print(f"figures embeddings 1024 ({len(EMBED)} B): "
          f"{timed(n, lambda: figures_of(EMBED)):.2f} µs "
          f"(json.loads of it: {timed(2000, lambda: json.loads(EMBED)):.1f} µs)")
    tail = Tail()
    print(f"tail per event ({len(EVENT)} B): {timed(200000, lambda: tail.feed(EVENT)):.3f} µs")

    def stream_end() -> None:
        t = Tail()
        for _ in range(200):
            t.feed(EVENT)
        t.feed(LAST)
        t.figures()
    t = Tail()
    for _ in range(200):
        t.feed(EVENT)
    t.feed(LAST)
    print(f"tail end (200-event stream, its figures): {timed(n, t.figures):.2f} µs; "
          f"a whole 200-event stream fed and read: {timed(500, stream_end):.1f} µs")
    u = Usage()
    f = figures_of(CHAT)
    row = ("2026-12-07", "alice", "alpha")
    print(f"count: {timed(n, lambda: u.count(row, 200, f, 0.0, 'local')):.2f} µs")
    loop = asyncio.new_event_loop()
    print(f"ended, no journal: {loop.run_until_complete(ended_cost(Usage(), n)):.2f} µs")
    from support import journald

    why = journald.unavailable()
    if why:
        print(f"ended + journal.send: not measured ({why})")
        return
    from systemd import journal

    with journald.private_journald():
        loop.run_until_complete(ended_cost(Usage(Audit(journal.send)), 200))   # warm
        cost = loop.run_until_complete(ended_cost(Usage(Audit(journal.send)), 5000))
    print(f"ended + journal.send (a real journald): {cost:.2f} µs")


if __name__ == "__main__":
    main()
