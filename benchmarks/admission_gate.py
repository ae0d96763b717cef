"""What the gateway's gate (lokid.gateway.admission over lokid.core.serve.fairshare) costs a
request, in process: 1,000 named keys, each request from one of them at random.

Cases, each timed over REQUESTS requests on the loop the gateway runs on (uvloop where
installed):
- ``bare``: an empty async context manager where the gate is (the floor);
- ``free``: the gate with a free slot for every request (one client at a time: the case
  of a team whose engine is not full, and of today's single anonymous client);
- ``contended``: 64 requests at once on an engine of 4 slots, each holding its slot for
  one turn of the loop: every request but 4 waits, is woken by fair share, and leaves.
The figure is the mean time per request (µs) of the gate's own work; the HTTP path around
it is benchmarks/gateway_latency.py's. Run: ``.venv/bin/python benchmarks/admission_gate.py``.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from collections.abc import AsyncIterator
from typing import Any

from lokid.core.serve.keys import Identity, Limits
from lokid.gateway.admission import Admission
from lokid.gateway.context import IDENTITY_KEY
from lokid.gateway.presets import Preset

REQUESTS = 100_000
KEYS = 1000


def identities() -> list[Identity]:
    return [Identity(f"user{i}", "batch" if i % 10 == 0 else "interactive",
                     limits=Limits(max_in_flight=8)) for i in range(KEYS)]


@contextlib.asynccontextmanager
async def bare(_request: Any, _preset: Any, _url: str, _route: str) -> AsyncIterator[None]:
    yield


async def one_at_a_time(gate: Any, people: list[Identity], preset: Preset) -> float:
    rng = random.Random(1)
    start = time.perf_counter()
    for _ in range(REQUESTS):
        request = {IDENTITY_KEY: people[rng.randrange(KEYS)]}
        async with gate(request, preset, "http://x", "/v1/chat/completions"):
            pass
    return (time.perf_counter() - start) / REQUESTS * 1e6


async def contended(gate: Any, people: list[Identity], preset: Preset) -> float:
    rng = random.Random(2)
    per_task = REQUESTS // 64

    async def worker() -> None:
        for _ in range(per_task):
            request = {IDENTITY_KEY: people[rng.randrange(KEYS)]}
            async with gate(request, preset, "http://x", "/v1/chat/completions"):
                await asyncio.sleep(0)

    start = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(64)))
    return (time.perf_counter() - start) / (per_task * 64) * 1e6


async def main() -> None:
    people = identities()
    preset = Preset("alpha", state="ready", argv=("llama-server", "-np", "4"))
    for name, run in (("free", one_at_a_time), ("contended", contended)):
        base = await run(bare, people, preset)
        admission = Admission(10_000, 1_000, lambda: None, lambda _n: None)
        gated = await run(admission.gate, people, preset)
        assert admission.share.running("alpha") == 0 and not admission.waiters
        print(f"{name:10s} bare {base:6.2f} µs  gate {gated:6.2f} µs  added "
              f"{gated - base:6.2f} µs per request ({KEYS} keys, {REQUESTS} requests)")


if __name__ == "__main__":
    try:
        import uvloop
        uvloop.install()
    except ImportError:
        pass
    asyncio.run(main())
