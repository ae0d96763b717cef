"""lokid.toml's ``[placement]`` table: whether the gateway places engines by memory,
how much the engines may hold on the host, and what each device keeps free (issue 29).

::

    [placement]
    enabled = true                 # the default: on-demand starts are placed by memory
    host_memory = "48G"            # what lokid's engines may hold in RAM together
    reserve = { host = "4G", GPU0 = "2G" }   # headroom kept free on each device
    max_wait = "10min"             # how long a request waits for room, then 503

Sizes are systemd's (``MemoryMax=``: a number of bytes, or with ``K``, ``M``, ``G``,
``T`` base 1024; ``GiB``/``MiB`` and ``GB``/``MB`` read as the same base-1024 units,
since every memory figure lokid shows is base 1024). ``host_memory`` bounds the host
beyond what ``/proc/meminfo`` and the engines' slice ``MemoryMax=`` say (the smallest
wins): an operator who shares a server with other services says what lokid may take.
A device named in ``reserve`` that the host does not have is no error (a GPU can be
missing today and back tomorrow); it is shown by ``lokictl top``. Part of the pure core.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field

from ..config.tomlread import Checker, tname
from ..serve.tables import span_setting

PLACEMENT_KEYS = ("enabled", "host_memory", "reserve", "max_wait")
MAX_SIZE = 1 << 50   # 1 PiB: more is a typing error, not a machine
_SIZE = re.compile(r"^\s*(\d{1,16}(?:\.\d{1,6})?)\s*([KMGT]?)(?:i?B)?\s*$", re.IGNORECASE)
_UNITS = {"": 1, "K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}
SIZE_FORMS = 'bytes, or a size such as "512M", "48G" or "1.5T" (base 1024, as MemoryMax=)'
MAX_WAIT = 600.0   # seconds a request waits for room, then 503 (a start's own bound)
MAX_WAIT_RANGE = (1.0, 3600.0)
_DEVICE = re.compile(r"^(host|GPU\d{1,2})$")


@dataclass(frozen=True)
class PlacementConfig:
    enabled: bool = True
    host_memory: int | None = None            # bytes; None: the host's own figures only
    reserve: Mapping[str, int] = field(default_factory=dict)   # device → bytes
    max_wait: float = MAX_WAIT                # seconds a request waits for room


def parse_size(value: object) -> int:
    """A size in bytes from an int or a systemd-style string; ValueError saying what is
    valid otherwise."""
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise ValueError(f"must be {SIZE_FORMS}, not {tname(value)}")
    if isinstance(value, int):
        n = value
    else:
        m = _SIZE.match(value)
        if m is None:
            raise ValueError(f"{value!r} is not a size: use {SIZE_FORMS}")
        n = int(float(m.group(1)) * _UNITS[m.group(2).upper()])
    if not 0 <= n <= MAX_SIZE:
        raise ValueError(f"{value!r} is out of range (0 to 1 PiB)")
    return n


def parse_placement(t: Checker | None) -> PlacementConfig:
    """The ``[placement]`` table (its checker, keys already checked; None when absent)."""
    if t is None:
        return PlacementConfig()
    enabled = t.boolean("enabled", True)
    host_memory = None
    if "host_memory" in t.data:
        try:
            host_memory = parse_size(t.data["host_memory"])
        except ValueError as e:
            raise t.error("host_memory", str(e)) from None
    raw = t.data.get("reserve", {})
    if not isinstance(raw, dict):
        raise t.error("reserve", 'must be a table of sizes by device, such as '
                      '{ host = "4G", GPU0 = "2G" }, not ' + tname(raw))
    reserve: dict[str, int] = {}
    for device, size in raw.items():
        if not _DEVICE.match(str(device)):
            raise t.error("reserve", f"{device!r} is not a device: host, or GPU0, GPU1 … "
                          "(as lokictl top names them)")
        try:
            reserve[str(device)] = parse_size(size)
        except ValueError as e:
            raise t.error("reserve", f"{device}: {e}") from None
    wait = span_setting(t, "max_wait", *MAX_WAIT_RANGE, "1s to 1h")
    return PlacementConfig(enabled=enabled, host_memory=host_memory, reserve=reserve,
                           max_wait=MAX_WAIT if wait is None else wait)
