#!/usr/bin/env python3
"""Journal volume of an automatic launch: the engine's output lines per chat request,
with log verbosity 4 (what lokid added to every automatic launch before) against the
plan lokid makes now, side by side.

Verbosity 4 exists for one line, ``offloaded N/M layers to GPU`` (the layers-in-RAM
verdict reads it), and an engine without a GPU backend never prints it; the plan now
leaves such an engine at its default verbosity. Same engine (the real llama-server
b11434, a CPU build), same generated model (the tiny GLM-4.5-style model with an MTP
head, so that ``spec.mode = "auto"`` really switches speculation on), same requests:

- old: the plan's argv plus ``-lv 4``;
- new: the plan's argv as it is (on this CPU-only engine, without ``-lv``).

Everything the engine prints goes to one file; a request's lines are those that
appear from the moment it is sent until the output has been quiet for a while.
Prints start-up lines, lines per request and the ratios.

    .venv/bin/python benchmarks/journal_volume.py [--requests 5]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT))

from support.enginekit import (  # noqa: E402
    engine_binary,
    free_port,
    running,
    write_config,
    write_preset,
)
from support.models import write_glm4moe_mtp  # noqa: E402

from lokid.planning.gather import make_plan  # noqa: E402

QUIET = 0.5  # seconds without a new line: the engine is done with a request


def line_count(log: Path) -> int:
    return log.read_bytes().count(b"\n")


def settle(log: Path) -> int:
    """The log's line count once it has stopped growing for QUIET seconds."""
    count, since = line_count(log), time.monotonic()
    while time.monotonic() - since < QUIET:
        time.sleep(0.05)
        now = line_count(log)
        if now != count:
            count, since = now, time.monotonic()
    return count


def measure(argv: list[str], env: dict[str, str], log: Path,
            requests: int) -> tuple[int, list[int]]:
    """Start-up lines, and the lines of each chat request."""
    per_request = []
    with running(argv, log, env) as eng:
        startup = settle(log)
        before = startup
        for i in range(requests):
            r = httpx.post(eng.url + "/v1/chat/completions", timeout=120, json={
                "messages": [{"role": "user", "content": f"Hello {i}"}],
                "max_tokens": 32, "seed": 1, "temperature": 0,
            })
            r.raise_for_status()
            after = settle(log)
            per_request.append(after - before)
            before = after
    return startup, per_request


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=5)
    args = ap.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        (root / "models").mkdir()
        model = write_glm4moe_mtp(root / "models" / "glm-mtp.gguf", part="full")
        config = write_config(root, engine_binary(), [root / "models"])
        write_preset(config, "demo", f'model = "{model.name}"\nctx = 2048\n'
                     f'port = {free_port()}\n[spec]\nmode = "auto"\n')
        plan = make_plan(str(config), "demo", environ={})
        if not plan.spec.auto or "-lv" in plan.argv:
            print(f"expected an automatic launch without -lv on this CPU-only engine; got "
                  f"auto={plan.spec.auto}, argv {plan.argv}", file=sys.stderr)
            return 1
        new_argv = list(plan.argv)
        old_argv = new_argv + ["-lv", "4"]
        env = dict(plan.env)
        runs = {}
        # Alternate (old, new, old, new): the counts should not depend on the order.
        for round_ in range(2):
            for label, argv in (("old", old_argv), ("new", new_argv)):
                runs[(label, round_)] = measure(argv, env, root / f"{label}-{round_}.log",
                                                args.requests)

    def figures(label: str) -> tuple[float, float]:
        starts = [runs[(label, r)][0] for r in range(2)]
        lines = [n for r in range(2) for n in runs[(label, r)][1]]
        return statistics.median(starts), statistics.mean(lines)

    old_start, old_req = figures("old")
    new_start, new_req = figures("new")
    verdict = next(n for n in plan.notes if n.startswith("automatic speculation"))
    print(f"engine: {plan.argv[0]}; model: tiny glm4moe with an MTP head, spec.mode = auto "
          f"({', '.join(plan.spec.types)})")
    print(f"plan note: {verdict}")
    print(f"{args.requests} chat requests per run, 2 runs per argv, alternating")
    print(f"{'':24} {'start-up lines':>15} {'lines/request':>14}")
    print(f"{'old (plan + -lv 4)':24} {old_start:15.0f} {old_req:14.1f}")
    print(f"{'new (the plan)':24} {new_start:15.0f} {new_req:14.1f}")
    print(f"{'ratio old/new':24} {old_start / new_start:14.1f}x {old_req / new_req:13.1f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
