#!/usr/bin/env python3
"""The cost of one key-level edit by its size: lokid.core.config.presetedit.set_keys and unset_keys
with 16 to 256 keys (256: the most one SetPresetKeys takes), side by side in one run with
the way today's main did it (one parse and one write of the whole text per key: the
reference), on the shipped annotated example preset.

Each size is timed as the best of --reps runs, and printed with the ratio of its time to
the previous size's: a linear cost doubles with the keys (ratio ~2), the reference's
quadratic one quadruples. The goal: from 128 to 256 keys, the edit's ratio at most 3
for 1.9 times the keys (exits 1 above it); the reference's ratio is printed beside it, for scale.

What remains above linear is tomlkit's own: each key it appends scans the table it goes
into (``Container._get_last_index_before_table``), bounded here by the 256 keys and the
64 KiB of a preset file.

    .venv/bin/python benchmarks/edit_keys.py [--reps 5]
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from lokid.core.config import presetedit  # noqa: E402

EXAMPLE = (ROOT / "etc" / "presets" / "example.toml").read_text()
SIZES = (16, 32, 64, 128, 240)   # 240: the file's 256 keys hold the example's own too
GOAL_RATIO = 3.0


def per_key(text: str, values: dict[str, object]) -> str:
    """The reference: one whole edit (a parse and a write) per key."""
    for key, value in values.items():
        text = presetedit.set_keys(text, {key: value})
    return text


def best(fn: Callable[[], object], reps: int) -> float:
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--reps", type=int, default=5)
    args = p.parse_args()
    print(f"{'keys':>5} {'set_keys':>10} {'ratio':>6} {'unset':>10} {'ratio':>6} "
          f"{'per key (ref)':>14} {'ratio':>6}")
    prev: tuple[float, float, float] | None = None
    last_ratio = 0.0
    for n in SIZES:
        values: dict[str, object] = {f"env.V{i}": f"value {i}" for i in range(n)}
        edited = presetedit.set_keys(EXAMPLE, values)
        t_set = best(partial(presetedit.set_keys, EXAMPLE, values), args.reps)
        t_unset = best(partial(presetedit.unset_keys, edited, list(values)), args.reps)
        t_ref = best(partial(per_key, EXAMPLE, values), max(1, args.reps // 2))
        ratios = ("", "", "") if prev is None else tuple(
            f"{now / before:6.2f}" for now, before in zip((t_set, t_unset, t_ref), prev,
                                                          strict=True))
        print(f"{n:5d} {t_set * 1e3:8.1f}ms {ratios[0]:>6} {t_unset * 1e3:8.1f}ms "
              f"{ratios[1]:>6} {t_ref * 1e3:12.1f}ms {ratios[2]:>6}")
        if prev is not None:
            last_ratio = t_set / prev[0]
        prev = (t_set, t_unset, t_ref)
    ok = last_ratio <= GOAL_RATIO
    print(f"set_keys from {SIZES[-2]} to {SIZES[-1]} keys: x{last_ratio:.2f} "
          f"(goal at most x{GOAL_RATIO:.0f}): {'ok' if ok else 'ABOVE THE GOAL'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
