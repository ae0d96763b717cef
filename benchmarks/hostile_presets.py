#!/usr/bin/env python3
"""Reading presets: lokid's bounded reader against plain tomllib, good files and hostile ones.

For each text, side by side in one run: ``lokid.core.config.files.parse_preset`` (the
size cap, the lexer of core/config/tomlscan.py, tomllib, the walk over keys and values,
then the preset's own checks) and ``tomllib.loads`` alone (the reference; run in a
child process with a time limit, since on the hostile texts it may not end). Median
of --reps runs. The hostile texts are issue 13's: one dotted key of 16,000 parts
(32 KB), arrays nested 1,000 deep. lokid must refuse them at once; on the good
ones (the shipped example preset, and a 60 KB preset that is mostly comments) its
bounds must cost little beside tomllib.

    .venv/bin/python benchmarks/hostile_presets.py [--reps 9] [--limit 30]
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
sys.path.insert(0, str(ROOT))

from lokid.core.config.files import parse_preset  # noqa: E402
from lokid.core.errors import ConfigError  # noqa: E402

TOMLLIB = """
import sys, time, tomllib
text = open(sys.argv[1], encoding="utf-8").read()
t0 = time.perf_counter()
try:
    tomllib.loads(text)
    how = "parsed"
except Exception as e:
    how = type(e).__name__
print(time.perf_counter() - t0, how)
"""


def texts() -> dict[str, str]:
    comments = "".join(f"# line {i}: a comment about the preset, as operators write them\n"
                       for i in range(900))
    return {
        "example preset (shipped)": (ROOT / "etc" / "presets" / "example.toml").read_text(),
        "60 KB preset, mostly comments": comments + 'model = "m.gguf"\nctx = 4096\n',
        "one dotted key of 16,000 parts": 'model = "m.gguf"\n' + ".".join(["a"] * 16000)
        + " = 1\n",
        "arrays nested 1,000 deep": 'model = "m.gguf"\nextra_args = ' + "[" * 1000
        + "]" * 1000 + "\n",
    }


def lokid_s(path: Path, reps: int) -> tuple[float, str]:
    times, how = [], ""
    for _ in range(reps):
        t0 = time.perf_counter()
        try:
            parse_preset("bench", str(path))
            how = "parsed"
        except ConfigError as e:
            how = "refused: " + e.reason[:60]
        times.append(time.perf_counter() - t0)
    return statistics.median(times), how


def tomllib_s(path: Path, reps: int, limit: float) -> tuple[float, str]:
    times, how = [], ""
    for _ in range(reps):
        try:
            r = subprocess.run([sys.executable, "-c", TOMLLIB, str(path)], capture_output=True,
                               text=True, timeout=limit, check=True)
        except subprocess.TimeoutExpired:
            return limit, f"not done after {limit:.0f} s"
        took, how = r.stdout.split(maxsplit=1)
        times.append(float(took))
    return statistics.median(times), how.strip()


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=9)
    ap.add_argument("--limit", type=float, default=30.0)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        for name, text in texts().items():
            path = Path(tmp) / "bench.toml"
            path.write_text(text)
            mine, how = lokid_s(path, args.reps)
            # the reference once per hostile text: it may take its whole limit
            ref, ref_how = tomllib_s(path, args.reps if "preset" in name else 1, args.limit)
            print(f"{name} ({len(text.encode()) / 1024:.1f} KiB):\n"
                  f"  lokid parse_preset {mine * 1000:9.2f} ms  ({how})\n"
                  f"  tomllib.loads      {ref * 1000:9.2f} ms  ({ref_how})\n"
                  f"  ratio lokid/tomllib {mine / ref:.3g}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
