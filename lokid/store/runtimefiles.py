"""Every file ``$LOKI_RUNTIME_DIR`` holds for one preset, listed in one place, so that a
preset removed or renamed over the bus leaves none behind.

Each name has its home beside the code that writes it (the runtime plan, the reusable
plan, the failures the crash-loop rule counts, the last ready start, an attempt token
the state DB could not clear, what the last prestart step handed over, the processes a
start waits for, the daemon's note that a start runs on the CPU, the sizes of its slot
files); this module only
gathers them. A file left under a removed preset's
name would be found again by a later preset of that name: a stale plan read by the
meter, a crash-loop count it never earned.
"""

from __future__ import annotations

import os

from .cleared import CLEARED_SUFFIX
from .exits import FAILURES_SUFFIX, READY_SUFFIX
from .handoff import SUFFIX as HANDOFF_SUFFIX
from .holds import SUFFIX as HOLD_SUFFIX
from .oncpunote import SUFFIX as ONCPU_SUFFIX
from .plancache import SUFFIX as REUSE_SUFFIX
from .runtimedir import RUNTIME_SUFFIX
from .slotsizes import SUFFIX as SLOTS_SUFFIX

PRESET_SUFFIXES = (RUNTIME_SUFFIX, REUSE_SUFFIX, FAILURES_SUFFIX, READY_SUFFIX,
                   CLEARED_SUFFIX, HANDOFF_SUFFIX, HOLD_SUFFIX, ONCPU_SUFFIX, SLOTS_SUFFIX)


def remove_preset_files(runtime_dir: str, preset: str) -> list[str]:
    """Remove the runtime files of ``preset`` (which must not run); the names removed.
    OSError other than an absent file goes to the caller."""
    removed = []
    for suffix in PRESET_SUFFIXES:
        try:
            os.unlink(os.path.join(runtime_dir, preset + suffix))
        except FileNotFoundError:
            continue
        removed.append(preset + suffix)
    return removed
