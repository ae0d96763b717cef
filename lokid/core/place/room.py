"""The room of each device, from what the engine, the kernel and systemd say (issue 29).

Pure parsers; the edges read the text (``llama-server --list-devices``,
``/proc/meminfo``, the slice's ``memory.max`` / ``memory.current``, systemd's
``MemoryMax``) and hand it here. Every input comes from outside lokid, so:

- no input raises: garbage lines are skipped, a missing figure is 0 (or "no limit"
  where that is what absence means), bytes are decoded with replacement;
- every figure is bounded: a number of more than :data:`_MAX_DIGITS` digits is
  garbage, not a device with 10^10000 bytes (Python would parse it, and the policy
  would then place everything there), and at most :data:`MAX_DEVICES` devices and
  :data:`_MAX_LINES` lines are read;
- free memory is never more than the total (a driver bug or a torn read must not
  create room), and room is never negative.

The device list is what llama.cpp itself sees, printed by ``common/arg.cpp``'s
``--list-devices`` as ``"  %s: %s (%zu MiB, %zu MiB free)"`` (``Available devices:``
then ``  (none)`` on a CPU-only build) and by ``device_info`` in every -lv 4 log as
``  - CUDA0   : NVIDIA H200 (143155 MiB, 142629 MiB free)``; both shapes are read.
The class is ``ListedDevice``, not ``Device``: :mod:`lokid.core.place.policy` has a
``Device`` (a place with a total and a reserve), which the caller builds from this.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

MiB = 2**20
KiB = 2**10
MAX_DEVICES = 64
_MAX_LINES = 4096
_MAX_LINE = 1024
_MAX_DIGITS = 20                 # 2**64 has 20 digits: anything longer is garbage
UINT64_MAX = 2**64 - 1           # systemd's "infinity" for MemoryMax and friends

_DEVICE = re.compile(
    r"^\s*(?:-\s*)?(?P<name>[A-Za-z][A-Za-z0-9_-]{0,31})\s*:\s*(?P<desc>.*?)\s*"
    r"\((?P<total>\d{1,20}) MiB, (?P<free>\d{1,20}) MiB free\)\s*$")
_MEMINFO = re.compile(r"^(?P<key>[A-Za-z_()]+):\s+(?P<value>\d{1,20})(?:\s+kB)?\s*$")


@dataclass(frozen=True)
class ListedDevice:
    """One device as llama.cpp lists it."""

    name: str            # "CUDA0", "Vulkan1", "CPU"
    backend: str         # the name without its index: "CUDA", "Vulkan", "CPU"
    description: str     # "NVIDIA H200"
    total_bytes: int
    free_bytes: int      # at most total_bytes


@dataclass(frozen=True)
class MemInfo:
    """The host's memory as /proc/meminfo says, in bytes."""

    total: int
    available: int


def _text(data: str | bytes) -> str:
    return data.decode("utf-8", "replace") if isinstance(data, bytes) else data


def _lines(data: str | bytes) -> list[str]:
    return [line for line in _text(data).splitlines()[:_MAX_LINES] if len(line) <= _MAX_LINE]


def parse_devices(output: str | bytes) -> list[ListedDevice]:
    """The devices in ``llama-server --list-devices`` output (or device_info lines of a
    log, their timestamp prefix cut), in their order, the first listing of a name kept;
    [] for none or garbage."""
    found: list[ListedDevice] = []
    seen: set[str] = set()
    for line in _lines(output):
        m = _DEVICE.match(line)
        if m is None or m["name"] in seen:
            continue
        total = int(m["total"]) * MiB
        free = min(int(m["free"]) * MiB, total)
        name = m["name"]
        seen.add(name)
        found.append(ListedDevice(name=name, backend=name.rstrip("0123456789") or name,
                                  description=m["desc"], total_bytes=total, free_bytes=free))
        if len(found) == MAX_DEVICES:
            break
    return found


def parse_meminfo(text: str | bytes) -> MemInfo:
    """MemTotal and MemAvailable, in bytes. A kernel without MemAvailable (before 3.14)
    gets MemFree + Buffers + Cached, its usual stand-in; absent figures are 0, and
    available is never more than total."""
    kib: dict[str, int] = {}
    for line in _lines(text):
        m = _MEMINFO.match(line)
        if m is not None:
            kib.setdefault(m["key"], int(m["value"]))
    total = kib.get("MemTotal", 0) * KiB
    if "MemAvailable" in kib:
        available = kib["MemAvailable"] * KiB
    else:
        available = sum(kib.get(k, 0) for k in ("MemFree", "Buffers", "Cached")) * KiB
    return MemInfo(total=total, available=min(available, total))


def parse_cgroup_bytes(text: str | bytes) -> int | None:
    """A cgroup v2 memory file (``memory.max``, ``memory.current``): bytes, or None for
    ``max`` (no limit) and for anything that is not a plain number (the caller treats
    an unreadable limit as none: refusing to start on garbage would be worse)."""
    value = _text(text).strip()
    if value == "max" or not value.isascii() or not value.isdigit() or len(value) > _MAX_DIGITS:
        return None
    n = int(value)
    return None if n >= UINT64_MAX else n


def memory_max_property(value: object) -> int | None:
    """systemd's ``MemoryMax`` (a D-Bus uint64): bytes, or None for infinity
    (2**64-1) and for anything that is not a uint64."""
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < UINT64_MAX:
        return None
    return value


def host_room(meminfo: MemInfo, limits: Sequence[int | None] = (), used: int = 0) -> int:
    """What engines may still take on the host: MemAvailable, bounded by each limit
    (``memory.max``, ``MemoryMax``; None = none) less what the slice already uses."""
    room = meminfo.available
    for limit in limits:
        if limit is not None:
            room = min(room, limit - max(0, used))
    return max(0, room)


def with_reserve(room: Mapping[str, int], reserve: Mapping[str, int],
                 default: int = 0) -> dict[str, int]:
    """Each device's room less its reserve (``default`` for one not named), never
    below 0; a negative reserve counts as 0 (it must not create room)."""
    return {name: max(0, free - max(0, reserve.get(name, default)))
            for name, free in room.items()}
