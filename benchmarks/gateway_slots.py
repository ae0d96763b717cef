#!/usr/bin/env python3
"""A swap keeps the users' caches: the prefill a long conversation pays after its model was
swapped out and back, with the slots restored and without, side by side in one run.

One run sets up the real stack on a private bus: a dbus-daemon, ``lokid daemon`` (local
runner) and ``lokid gateway`` in its own process, as the unit runs it, with two GPU groups
of the generated tiny llama (one slot each, 4,096 tokens: the model's own context):

- ``restore``: A and B, planned as lokid plans a group (``--slot-save-path`` in the
  state directory): the gateway saves A's slot before its swap's stop and restores it at
  A's next start;
- ``without``: A2 and B2, the same but A2 started with ``--no-slots`` (the engine's slot
  endpoints off): its save is refused, as on an engine without ``--slot-save-path``, so
  nothing is restored. This is what every swap did before issue 22's item 7.

Each A holds the same conversation of ``--turns`` turns (a user message of ~360 tokens
and a reply of 16 each), one request a turn through the gateway. Then B (A swapped out),
then A's next turn (B swapped out, A started again). Measured on that request: the prompt
tokens the engine evaluated (the reply's ``timings.prompt_n``), its prompt time
(``prompt_ms``) and the whole request (sent → answered, A's start included).

Measured on the 2-CPU machine of issue 22 (6 turns): restored 506 prompt tokens evaluated
(2,998 from the restored cache), without 3,504: 6.9x fewer; prompt time 53 ms against
531 ms; the request, A's start included, 318 ms against 1,194 ms. On a GPU with a real
model the prefill saved is the same count of tokens, at that model's prefill rate.

    .venv/bin/python benchmarks/gateway_slots.py [--turns 6]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT))

import aiohttp  # noqa: E402
from gateway_latency import gateway_process  # noqa: E402
from support.daemonproc import daemon_process  # noqa: E402
from support.enginekit import free_port, tiny_config, write_preset  # noqa: E402

PRESET = 'model = "tiny.gguf"\nctx = 8192\nport = {port}\nextra_args = [{extra}]\n' \
         '[serve]\non_demand = true\ngroup = "{group}"\n'
CASES = {"restore": ("A", "B", "gpu0", '"-np", "1"'),
         "without": ("A2", "B2", "gpu1", '"-np", "1", "--no-slots"')}


def user_turn(i: int) -> str:
    return f"Turn {i}. " + " ".join(f"Tell me about topic {i}.{j} in detail." for j in range(9))


async def chat(session: aiohttp.ClientSession, url: str, model: str,
               messages: list[dict[str, str]]) -> tuple[dict[str, Any], str, float]:
    t = time.perf_counter()
    async with session.post(url + "/v1/chat/completions", json={
            "model": model, "messages": messages, "max_tokens": 16, "temperature": 0,
            "seed": 1, "ignore_eos": True, "cache_prompt": True}) as r:
        data = await r.json()
        assert r.status == 200, data
    return data["timings"], data["choices"][0]["message"]["content"], time.perf_counter() - t


async def case(session: aiohttp.ClientSession, url: str, a: str, b: str,
               turns: int) -> dict[str, float]:
    messages: list[dict[str, str]] = []
    for i in range(turns):
        messages.append({"role": "user", "content": user_turn(i)})
        _, reply, _ = await chat(session, url, a, messages)
        messages.append({"role": "assistant", "content": reply})
    await chat(session, url, b, [{"role": "user", "content": "Hi"}])   # A swapped out
    messages.append({"role": "user", "content": user_turn(turns)})
    timings, _, wall = await chat(session, url, a, messages)          # A back
    return {"prompt_n": timings["prompt_n"], "cache_n": timings.get("cache_n", 0),
            "prompt_ms": timings["prompt_ms"], "wall_ms": wall * 1000}


async def measure(url: str, turns: int) -> None:
    async with aiohttp.ClientSession() as session:
        got = {name: await case(session, url, a, b, turns)
               for name, (a, b, _, _) in CASES.items()}
    r, w = got["restore"], got["without"]
    print(f"a conversation of {turns} turns, swapped out and back, its next turn:")
    print(f"  {'':34} {'restored':>10} {'without':>10} {'ratio':>8}")
    for key, label in (("prompt_n", "prompt tokens evaluated"),
                       ("cache_n", "prompt tokens from the cache"),
                       ("prompt_ms", "prompt time (ms)"),
                       ("wall_ms", "request, A's start included (ms)")):
        ratio = f"{r[key] / w[key]:.3f}" if w[key] else "-"
        print(f"  {label:34} {r[key]:>10.0f} {w[key]:>10.0f} {ratio:>8}")
    if r["prompt_n"]:
        print(f"  with the restore the engine evaluated {w['prompt_n'] / r['prompt_n']:.1f}x "
              "fewer prompt tokens")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument("--turns", type=int, default=6)
    args = p.parse_args()
    with tempfile.TemporaryDirectory(prefix="lokid-slots-bench-") as tmp:
        root = Path(tmp)
        config = tiny_config(root, "unused", "")
        for a, b, group, extra in CASES.values():
            write_preset(config, a, PRESET.format(port=free_port(), extra=extra, group=group))
            write_preset(config, b, PRESET.format(port=free_port(), extra='"-np", "1"',
                                                  group=group))
        gw_port = free_port()
        # the gateway reads the slot files' sizes where the daemon's engines list them
        os.environ["LOKI_RUNTIME_DIR"] = str(root / "run")
        with daemon_process(config, root) as daemon:
            with gateway_process(config, daemon.address, gw_port):
                asyncio.run(measure(f"http://127.0.0.1:{gw_port}", args.turns))
    return 0


if __name__ == "__main__":
    sys.exit(main())
