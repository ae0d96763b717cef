"""The host's physical CPU cores this process may run on (issue 47: the scaling rule's
compute, :func:`lokid.core.serve.scaling.shares`).

llama-server computes with one thread per physical core by default (its
``common_cpu_get_num_math``: a core's hyperthread sibling adds nothing to its matrix
work), so an engine's share of the CPU is counted in physical cores, not in the logical
CPUs ``os.cpu_count`` gives: on a host of 16 cores and 32 threads, two engines of
default threads already take every core. Only the CPUs this process may use count (its
affinity: a unit's ``AllowedCPUs`` or ``CPUAffinity``), the engines' units running on
the same set unless an operator set theirs apart.

Read once: cores do not come and go under a running gateway.
"""

from __future__ import annotations

import functools
import os
from pathlib import Path

CPUS = Path("/sys/devices/system/cpu")


def physical_cores(root: Path = CPUS) -> int:
    """How many physical cores the CPUs of this process's affinity span; 0 when unknown.
    A CPU whose topology cannot be read counts as a core of its own."""
    try:
        cpus = os.sched_getaffinity(0)
    except OSError:
        return 0
    cores = set()
    for cpu in cpus:
        try:
            siblings = (root / f"cpu{cpu}" / "topology" / "thread_siblings_list").read_text()
        except OSError:
            siblings = f"cpu{cpu}"
        cores.add(siblings.strip())
    return len(cores)


@functools.lru_cache(maxsize=1)
def host_cores() -> int:
    """:func:`physical_cores` of the real host, read once."""
    return physical_cores()
