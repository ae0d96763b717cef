"""The engine's disk reads and memory at one moment: what the benchmark's thrash hint compares.

A type of its own, because three edges produce it (the /proc readers, the
systemd runner's cgroup counters, the local runner) and the benchmark rules
consume it; none of them should import the others for it.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class IOSample:
    """The engine's disk reads so far and its memory, for the thrash hint.

    Where they come from depends on who runs the engine: ``/proc/<pid>/io`` and
    the RSS of the process (``lokid bench``, the local runner), or the cgroup
    counters systemd keeps for its unit. ``memory`` names which, since the two
    are not the same figure; ``memory_bytes`` None: not known.
    """

    read_bytes: int
    memory_bytes: int | None
    memory: str


# A sampler of the running engine: called before and after the turns at depth. None
# when the figures cannot be read (then there is no hint, never an invented one).
IOSampler = Callable[[], Awaitable[IOSample | None]]
