#!/usr/bin/env python3
"""How soon the daemon is ready with many presets, with a good engine and a hanging one.

``lokid daemon`` (session bus, local runner) serving N generated presets (default
50) of the tiny llama, from its start to READY=1 on its notify socket (sent once
the presets are planned, their engines' state known and the bus name owned):

- with the real llama-server and a cold probe cache (a fresh $LOKI_RUNTIME_DIR),
  side by side with that engine's own ``--version`` and ``--help`` run directly
  (the reference: what any tool must pay once to learn what the engine supports);
- with a warm probe cache (a second start: the disk copy of the probe is read);
- with an engine that never answers ``--help`` (a shell wrapper that sleeps):
  the daemon must not wait for the probe. Goal (issue 13): READY within 2 s.

Medians of --reps starts. Exits 1 when the hanging-engine goal is missed.

    .venv/bin/python benchmarks/daemon_ready.py [--presets 50] [--reps 3]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT))

from support.daemonproc import daemon_process  # noqa: E402
from support.enginekit import engine_binary, tiny_config  # noqa: E402

GOAL_HANGING_S = 2.0
HANGING = """#!/bin/sh
case " $* " in *" --help "*|*" --version "*) exec sleep 600;; esac
exec {engine} "$@"
"""


def write_presets(config: Path, count: int) -> None:
    for i in range(1, count):
        (config / "presets" / f"p{i:02d}.toml").write_text(
            f'model = "tiny.gguf"\nctx = 2048\nport = {20000 + i}\n')


def set_engine(config: Path, engine: str) -> None:
    text = (config / "lokid.toml").read_text().splitlines()
    text = [f'engine = "{engine}"' if line.startswith("engine") else line for line in text]
    (config / "lokid.toml").write_text("\n".join(text) + "\n")


def daemon_ready_s(config: Path, root: Path, runtime: Path) -> float:
    """One daemon start on a private bus until READY=1; stopped after."""
    try:
        with daemon_process(config, root, runtime) as d:
            return d.ready - d.started
    finally:
        subprocess.run(["pkill", "-f", "sleep 600"], check=False)


def raw_probe_s(engine: str) -> float:
    t0 = time.perf_counter()
    subprocess.run([engine, "--version"], capture_output=True, check=False)
    subprocess.run([engine, "--help"], capture_output=True, check=False)
    return time.perf_counter() - t0


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--presets", type=int, default=50)
    ap.add_argument("--reps", type=int, default=3)
    args = ap.parse_args()
    engine = engine_binary()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        config = tiny_config(root, "p00", "port = 20000\n")
        write_presets(config, args.presets)
        hanging = root / "hangs-on-help"
        hanging.write_text(HANGING.format(engine=engine))
        hanging.chmod(0o755)

        raw = statistics.median(raw_probe_s(engine) for _ in range(args.reps))
        cold = statistics.median(
            daemon_ready_s(config, root, Path(tempfile.mkdtemp(dir=tmp)))
            for _ in range(args.reps))
        warm_dir = Path(tempfile.mkdtemp(dir=tmp))
        daemon_ready_s(config, root, warm_dir)
        warm = statistics.median(daemon_ready_s(config, root, warm_dir)
                                 for _ in range(args.reps))
        set_engine(config, str(hanging))
        hang = statistics.median(
            daemon_ready_s(config, root, Path(tempfile.mkdtemp(dir=tmp)))
            for _ in range(args.reps))

    n = args.presets
    print(f"raw engine --version + --help (the reference): {raw * 1000:.0f} ms")
    print(f"daemon with {n} presets, real engine, cold probe cache: {cold * 1000:.0f} ms "
          f"({cold / raw:.1f}x one raw probe)")
    print(f"daemon with {n} presets, real engine, warm probe cache: {warm * 1000:.0f} ms "
          f"({warm / raw:.1f}x one raw probe)")
    print(f"daemon with {n} presets, engine hanging on --help: {hang * 1000:.0f} ms "
          f"(goal <= {GOAL_HANGING_S:.0f} s)")
    return 0 if hang <= GOAL_HANGING_S else 1


if __name__ == "__main__":
    sys.exit(main())
