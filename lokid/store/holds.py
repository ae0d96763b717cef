"""A start that waits for other engines to be gone: ``$LOKI_RUNTIME_DIR/<preset>.after``.

A swap in a GPU group stops one member and starts another; two models must never share
the GPU's memory. The daemon used to hold the new member's start until the old one's
unit was inactive, so the new one's whole start (its planning step, two interpreters,
the reads of its files) came after the old engine's teardown. Now the daemon starts it
at once and leaves this note: the processes of the members being stopped (their engine
step and its engine) and until when to wait for them. The new start plans meanwhile,
and its engine step (:func:`lokid.unit.steps.engine`) takes the note and waits for
those processes to be gone just before it spawns its engine: the teardown and the start
overlap up to the point where memory is needed, and no further.

The note is taken (read and removed) by the start it was written for; one whose time
is past, or a damaged one, is no note (:func:`take_hold`). Writer: the daemon (as root,
the file given to the runtime directory's owner, as the plans it makes ahead); reader:
the preset's engine step, as the unit's user.
"""

from __future__ import annotations

import json
import os
import time

from ..core.record import record

SUFFIX = ".after"   # $LOKI_RUNTIME_DIR/<preset>.after
LONGEST = 120.0     # seconds a note can hold a start, whatever its deadline says


@record
class Hold:
    """Wait for ``pids`` (the processes of the presets ``names``) to be gone, until
    ``until`` (``time.monotonic()``: CLOCK_MONOTONIC, the same for every process)."""

    names: tuple[str, ...]
    pids: tuple[int, ...]
    until: float


def _path(runtime_dir: str, preset: str) -> str:
    return os.path.join(runtime_dir, preset + SUFFIX)


def write_hold(runtime_dir: str, preset: str, hold: Hold,
               owner: tuple[int, int] | None = None) -> None:
    """Leave ``hold`` for the next start of ``preset`` (atomic; ``owner``: (uid, gid) to
    give the file, the daemon writing as root). OSError to the caller."""
    path = _path(runtime_dir, preset)
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump({"names": list(hold.names), "pids": list(hold.pids), "until": hold.until}, f)
        if owner is not None:
            os.fchown(f.fileno(), *owner)
    os.replace(tmp, path)


def take_hold(runtime_dir: str, preset: str) -> Hold | None:
    """The note left for this start, removed; None when there is none, when it is
    damaged, or when its time is past (a note that outlived the start it was for: its
    processes are gone or were killed, and their numbers may be another's now). No note
    holds a start longer than :data:`LONGEST` seconds from now."""
    path = _path(runtime_dir, preset)
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except FileNotFoundError:
        return None
    except (OSError, ValueError):
        data = None
    drop_hold(runtime_dir, preset)
    try:
        hold = Hold(tuple(str(n) for n in data["names"]),
                    tuple(int(p) for p in data["pids"] if int(p) > 0),
                    float(data["until"]))
    except (TypeError, KeyError, ValueError):
        return None
    now = time.monotonic()
    if hold.until <= now:
        return None
    return Hold(hold.names, hold.pids, min(hold.until, now + LONGEST))


def drop_hold(runtime_dir: str, preset: str) -> None:
    """No note for the next start of ``preset`` (none, or it cannot be removed)."""
    try:
        os.unlink(_path(runtime_dir, preset))
    except OSError:
        pass
