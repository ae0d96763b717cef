"""lokid.core.model.modelinfo.probe_model against gguf.GGUFReader on a Qwen-scale header.

Usage: .venv/bin/python benchmarks/probe_vs_ggufreader.py [--probe-runs N]
       [--reader-runs N] [--min-ratio R]

Writes a header like a real Qwen3 GGUF's (151,643-token vocab, 151,387 merges,
675 tensor infos; the tensors themselves are tiny) into a temporary directory,
then times, side by side in this one run:

- probe_model, uncached (the cache is cleared before each call): median of N runs;
- gguf.GGUFReader(path), which parses every field and tensor info: median of N runs
  (it takes seconds, so few).

Both read the same file after a warm-up read, so the page cache serves both.
Exits 1 when the reader/probe ratio is below --min-ratio (default 200).
"""

from __future__ import annotations

import argparse
import importlib.metadata
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import gguf

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))   # the fixture generators live with the tests

from support import models  # noqa: E402

from lokid.core.model import modelinfo  # noqa: E402


def timed(fn: Callable[[], object], runs: int) -> list[float]:
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return times


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--probe-runs", type=int, default=21)
    ap.add_argument("--reader-runs", type=int, default=2)
    ap.add_argument("--min-ratio", type=float, default=200.0)
    args = ap.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "qwen-scale.gguf"
        start = time.perf_counter()
        models.write_qwen_scale(path)
        written = time.perf_counter() - start
        path.read_bytes()                                # warm the page cache

        def probe() -> None:
            modelinfo.clear_cache()
            modelinfo.probe_model(path)

        info = modelinfo.probe_model(path)
        probe_times = timed(probe, args.probe_runs)
        reader_times = timed(lambda: gguf.GGUFReader(path), args.reader_runs)

    probe_s = statistics.median(probe_times)
    reader_s = statistics.median(reader_times)
    ratio = reader_s / probe_s
    print(f"file: {info.file_size / 1e6:.1f} MB, {models.QWEN_VOCAB} tokens, "
          f"{models.QWEN_MERGES} merges, {info.tensor_count} tensor infos "
          f"(written in {written:.2f} s)")
    print(f"probe_model (uncached): median {probe_s * 1e3:8.2f} ms of {len(probe_times)} runs "
          f"(min {min(probe_times) * 1e3:.2f}, max {max(probe_times) * 1e3:.2f})")
    print(f"gguf.GGUFReader:        median {reader_s * 1e3:8.2f} ms of {len(reader_times)} runs "
          f"(gguf {importlib.metadata.version('gguf')})")
    print(f"ratio: {ratio:.0f}x (required: {args.min_ratio:.0f}x)")
    if ratio < args.min_ratio:
        print("FAIL: the probe is not fast enough relative to GGUFReader", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
