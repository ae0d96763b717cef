#!/usr/bin/env python3
"""A model pull's cost against its references (issue 48): what does ``lokid pull-worker``
(the hub's listing, the file streamed to ``NAME.part``, its SHA-256 checked, fsynced and
renamed) cost against curl fetching the same file, and against curl then ``sha256sum``
(the same check done by hand)? And what does a resume save?

Each side fetches the same file of ``--size`` MiB (random bytes named ``x-Q4_K_M.gguf``)
from the hub's stand-in (:mod:`support.hubstand`, a process of its own on loopback) into a
fresh directory on the same file system; sides run in a seeded random order, ``--repeat``
times each. Printed per side: the median, min and max of the wall time and the median rate.
The stand-in (Python's http.server) bounds every side alike: a verdict inside the spread
says so.

- **lokid**: ``python -m lokid pull-worker --dir D -- org/x-GGUF:Q4_K_M`` (the process the
  pull's unit runs, started as the unit starts it);
- **curl**: ``curl -sSfL -o D/x.gguf <resolve URL>`` (no check of what came);
- **curl+sha256sum**: the same, then ``sha256sum`` of the file (the check by hand);
- **lokid resume**: the worker again on a part holding the first half (it hashes the half
  it has, then asks for the rest with a Range).

Measured on 2 CPUs, ``--size 512 --repeat 5 --seed 7`` (a tmpfs-less /var/tmp, the
stand-in on loopback): lokid 1.74 s median (1.73-1.87, 293 MiB/s), curl 0.57 s (0.52-0.70,
904 MiB/s), curl+sha256sum 2.21 s (2.16-2.29, 232 MiB/s), lokid resume from half 1.39 s
(1.34-1.84). lokid takes 0.79 x curl+sha256sum (it hashes while it writes, where the hand
check reads the file again), 3 x curl unchecked; a resume from half takes 0.80 x a fresh
pull, since it reads and hashes the half it has before asking for the rest.

    .venv/bin/python benchmarks/pull_throughput.py [--size 512] [--repeat 5] [--seed 1]
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(REPO))

from support.hubstand import start_hub, stop_hub  # noqa: E402

NAME = "x-Q4_K_M.gguf"


def run_side(side: str, base: str, src: Path, work: Path) -> float:
    target = work / "out"
    shutil.rmtree(target, ignore_errors=True)
    target.mkdir()
    env = {**os.environ, "HF_ENDPOINT": base, "PYTHONPATH": str(REPO)}
    url = f"{base}/org/x-GGUF/resolve/main/{NAME}"
    if side == "lokid resume":
        half = src.stat().st_size // 2
        with open(src, "rb") as f, open(target / (NAME + ".part"), "wb") as out:
            out.write(f.read(half))
    start = time.perf_counter()
    if side.startswith("lokid"):
        subprocess.run([sys.executable, "-m", "lokid", "pull-worker", "--dir", str(target),
                        "--", "org/x-GGUF:Q4_K_M"], env=env, check=True,
                       stdout=subprocess.DEVNULL)
    else:
        subprocess.run(["curl", "-sSfL", "-o", str(target / NAME), url], check=True)
        if side == "curl+sha256sum":
            subprocess.run(["sha256sum", str(target / NAME)], check=True,
                           stdout=subprocess.DEVNULL)
    took = time.perf_counter() - start
    got = target / NAME
    assert got.stat().st_size == src.stat().st_size, side
    return took


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size", type=int, default=512, help="MiB")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    sides = ["lokid", "curl", "curl+sha256sum", "lokid resume"]
    with tempfile.TemporaryDirectory(prefix="lokid-pull-bench-", dir="/var/tmp") as tmp:
        work = Path(tmp)
        repo = work / "hub" / "org" / "x-GGUF"
        repo.mkdir(parents=True)
        src = repo / NAME
        with open(src, "wb") as f:
            for _ in range(args.size):
                f.write(os.urandom(1 << 20))
        proc, base = start_hub(work / "hub")
        try:
            order = [s for s in sides for _ in range(args.repeat)]
            random.Random(args.seed).shuffle(order)
            print(f"{args.size} MiB, {args.repeat} runs per side, order (seed {args.seed}): "
                  + ", ".join(order))
            times: dict[str, list[float]] = {s: [] for s in sides}
            for side in order:
                times[side].append(run_side(side, base, src, work))
        finally:
            stop_hub(proc)
    print(f"{'side':<16} {'median s':>9} {'min':>7} {'max':>7} {'MiB/s':>7}")
    for side in sides:
        t = times[side]
        med = statistics.median(t)
        print(f"{side:<16} {med:9.2f} {min(t):7.2f} {max(t):7.2f} {args.size / med:7.0f}")
    lokid, ref = times["lokid"], times["curl+sha256sum"]
    ratio = statistics.median(lokid) / statistics.median(ref)
    overlap = min(lokid) <= max(ref) and min(ref) <= max(lokid)
    print(f"verdict: lokid takes {ratio:.2f} x curl+sha256sum's median"
          + (" (the spreads overlap: within the noise)" if overlap else ""))
    resume = statistics.median(times["lokid resume"]) / statistics.median(lokid)
    print(f"verdict: a resume from half takes {resume:.2f} x a fresh pull")


if __name__ == "__main__":
    main()
