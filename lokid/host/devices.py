"""This host's devices and their room, as read now (issue 29, item 1).

- **GPUs**: the NVIDIA driver (NVML: each GPU's total and used memory, and the
  processes holding some), where the engine has a GPU backend and the driver answers;
  else the engine's own ``llama-server --list-devices`` (any backend: CUDA, Vulkan,
  ROCm; each device's total and free memory as llama.cpp sees it). An engine without a
  GPU backend runs on the host alone: its GPUs are not asked.
- **The host**: ``/proc/meminfo`` (MemTotal, MemAvailable), bounded by the engines'
  slice ``loki.slice`` where an operator made one with ``MemoryMax=`` (its cgroup's
  ``memory.max`` and ``memory.current``) and by ``[placement] host_memory``.

Every figure that could not be read is said in :attr:`Room.notes`, in words an operator
can act on; the parsers (:mod:`lokid.core.place.room`) bound what they read. Nothing
here raises for what the host says: a host whose devices cannot be read has the host's
memory only.

**Unknown is not none** (issue 44, item 10). A GPU whose room could not be read is in
:attr:`Room.unknown` with the reason: one GPU the driver refused (``GPU1``), a GPU in MIG
mode (its room is its instances', see :mod:`lokid.host.nvml`), or every GPU
(:data:`~lokid.core.place.policy.ANY_GPU`) where neither the driver nor the engine's
``--list-devices`` answered (a non-zero exit is no answer: a CUDA build that cannot
start CUDA exits so). Taken as "no GPU", such a host refused every preset pinned to a
GPU ("needs 4 MiB on GPU1, which this host does not have"). An engine that answers and
lists no GPU is an answer (its engines run on the host), but two are not: a list whose
GPU backend says it did not start (``ggml_cuda_init: failed to initialize CUDA: …``,
exit status 0), and an empty list where the NVIDIA driver's own library is installed
and the driver did not answer (not loaded, or its nodes hidden or refused: the engine
needs the same driver). Both were a GPU host whose driver was down read as a host
without GPUs: the walk's preset pinned to GPU1 was refused with "which this host does
not have" instead of started and said to run on the CPU.

**UUIDs** (issue 44, item 8): :attr:`Room.uuids` maps each ``GPU-…`` and ``MIG-…`` UUID
the driver gave to lokid's name of that device, so that a preset pinned by UUID is sized
on it.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from ..core.place.footprint import gpu_of_device
from ..core.place.policy import ANY_GPU, HOST, Device, size_text
from ..core.place.room import parse_cgroup_bytes, parse_devices, parse_meminfo
from ..core.place.settings import PlacementConfig
from ..core.telemetry.enginelog import gpu_failure

LIST_TIMEOUT = 20.0      # seconds --list-devices may take (a CUDA init is ~0.2 s on an H200)
SLICE = "loki.slice"
UNKNOWN = 1 << 62        # a bound nothing set yet
CGROUP_ROOT = "/sys/fs/cgroup"


@dataclass(frozen=True)
class Room:
    """The devices (totals, reserves, what others hold) and each one's free memory now."""

    devices: tuple[Device, ...]
    free: Mapping[str, int]                 # bytes free now, per device
    sources: Mapping[str, str]              # per device: where its figures come from
    notes: tuple[str, ...] = ()             # what could not be read, and why
    names: Mapping[str, str] = field(default_factory=dict)   # "GPU0" → "NVIDIA H200"
    # per GPU, the driver's pid → bytes; None when the GPUs were not read from NVML
    processes: Mapping[str, Mapping[int, int]] | None = None
    uuids: Mapping[str, str] = field(default_factory=dict)    # "GPU-…"/"MIG-…" → "GPU0"
    # devices whose room could not be read → why (ANY_GPU: every GPU not listed)
    unknown: Mapping[str, str] = field(default_factory=dict)

    def gpus(self) -> tuple[str, ...]:
        return tuple(d.name for d in self.devices if d.gpu)

    def whole_gpus(self) -> tuple[str, ...]:
        """The GPUs a start's choice may give by index (``CUDA_VISIBLE_DEVICES=1``): not
        the MIG instances (``GPU0/MIG2``), which CUDA takes by UUID only."""
        return tuple(g for g in self.gpus() if "/" not in g)


def _read(path: str, limit: int = 1 << 16) -> str | None:
    try:
        with open(path, "rb") as f:
            return f.read(limit).decode("utf-8", "replace")
    except OSError:
        return None


def host_figures(placement: PlacementConfig, proc: str = "/proc",
                 cgroup_root: str = CGROUP_ROOT) -> tuple[int, int, str]:
    """The host's total for lokid's engines, what is free of it now, and whence; a total
    of 0 when nothing says (no /proc/meminfo here, no host_memory): unknown, not empty."""
    meminfo = parse_meminfo(_read(os.path.join(proc, "meminfo")) or "")
    total, free = meminfo.total, meminfo.available
    words = [f"/proc/meminfo (MemTotal {size_text(meminfo.total)}, MemAvailable "
             f"{size_text(meminfo.available)})"]
    if not total:   # unreadable: the other bounds alone, and no more than they say
        total = free = UNKNOWN
        words = [f"{os.path.join(proc, 'meminfo')} unreadable"]
    limit_text = _read(os.path.join(cgroup_root, SLICE, "memory.max"))
    limit = parse_cgroup_bytes(limit_text) if limit_text is not None else None
    if limit is not None:
        used = parse_cgroup_bytes(_read(os.path.join(cgroup_root, SLICE, "memory.current"))
                                  or "") or 0
        total, free = min(total, limit), min(free, max(0, limit - used))
        words.append(f"{SLICE} MemoryMax={size_text(limit)}")
    if placement.host_memory is not None:
        total, free = min(total, placement.host_memory), min(free, placement.host_memory)
        words.append(f"[placement] host_memory = {size_text(placement.host_memory)}")
    if total == UNKNOWN:
        return 0, 0, words[0]
    return total, min(free, total), ", bounded by ".join(words)


def listed_gpus(engine: str, env: Mapping[str, str] | None = None
                ) -> tuple[dict[str, tuple[int, int, str]], str]:
    """``{"GPU0": (total, free, description)}`` from ``engine --list-devices``, and why
    none were read ("" when the engine answered)."""
    try:
        done = subprocess.run([engine, "--list-devices"], capture_output=True,
                              timeout=LIST_TIMEOUT, env=dict(env) if env is not None else None,
                              stdin=subprocess.DEVNULL, check=False)
    except (OSError, subprocess.SubprocessError) as e:
        return {}, f"{engine} --list-devices failed: {type(e).__name__}: {e}"
    found: dict[str, tuple[int, int, str]] = {}
    for d in parse_devices(done.stdout + b"\n" + done.stderr):
        name = gpu_of_device(d.name)
        if name and name not in found:
            found[name] = (d.total_bytes, d.free_bytes, d.description)
    if done.returncode != 0:   # no answer: what it listed may not be all
        said = [line.strip() for line in done.stderr.decode("utf-8", "replace").splitlines()
                if line.strip() and not line.strip().startswith("Available devices")]
        last = f": {said[-1][:200]}" if said else ""
        return found, f"{engine} --list-devices failed: exit status {done.returncode}{last}"
    if not found:   # a GPU backend that could not start lists nothing: unknown, not none
        for line in (done.stdout + b"\n" + done.stderr).decode("utf-8", "replace"
                                                                ).splitlines()[:200]:
            failed = gpu_failure(line)
            if failed:
                return found, f"{engine} --list-devices: its GPU backend did not start " \
                              f"({failed})"
    return found, ""


def read_room(placement: PlacementConfig, *, engine: str | None = None,
              gpu_engine: bool = False, gpu: object | None = None,
              held: Mapping[str, int] | None = None, proc: str = "/proc",
              cgroup_root: str = CGROUP_ROOT,
              lister: Callable[[str], tuple[dict[str, tuple[int, int, str]], str]] | None = None
              ) -> Room:
    """The room of this host for lokid's engines.

    ``gpu_engine``: whether the engine has a GPU backend (else its GPUs are not asked);
    ``gpu``: a :class:`lokid.host.nvml.GpuMemory`; ``held``: what lokid's engines hold
    now per device (so that what others hold is the rest of what is used); ``lister``:
    :func:`listed_gpus` or a cache of it (the daemon's: a spawn per read is too many)."""
    held = held or {}
    processes: dict[str, dict[int, int]] | None = None
    notes: list[str] = []
    totals: dict[str, int] = {}
    free: dict[str, int] = {}
    sources: dict[str, str] = {}
    names: dict[str, str] = {}
    uuids: dict[str, str] = {}
    unknown: dict[str, str] = {}
    if gpu_engine:
        nvml = getattr(gpu, "devices", None)
        found = nvml() if callable(nvml) else None
        if found is not None:
            processes = {}
            for d in found:
                name = d.label
                if d.uuid:
                    uuids[d.uuid] = name
                if d.error:   # this GPU unknown, the others read
                    notes.append(d.error)
                    unknown[name] = d.error
                    continue
                if d.mig_mode:   # its instances are the room
                    parts = [x.label for x in found if x.index == d.index and x.mig >= 0]
                    unknown[name] = (f"{name} is in MIG mode: its memory is its MIG "
                                     f"instances' ({', '.join(parts) or 'none made'}); "
                                     "name one by its MIG- UUID in gpus")
                    notes.append(unknown[name])
                    continue
                # the driver's reserve (NVML v2) is no one's room: not in the total
                totals[name], free[name], names[name] = d.total - d.reserved, d.free, d.name
                sources[name] = "the NVIDIA driver (NVML)" + (
                    f", {size_text(d.reserved)} reserved by the driver" if d.reserved else "")
                processes[name] = dict(d.processes)
        elif engine:
            why = getattr(gpu, "why_unknown", lambda: "")()
            listed, failed = (lister or listed_gpus)(engine)
            if why:
                notes.append(why + "; the devices are read from the engine's --list-devices")
            if failed:
                notes.append(failed)
                unknown[ANY_GPU] = "; ".join(w for w in (why, failed) if w)
            for name, (total, nfree, desc) in listed.items():
                totals[name], free[name], names[name] = total, nfree, desc
                sources[name] = f"{os.path.basename(engine)} --list-devices"
            if not listed and not failed:
                if getattr(gpu, "driver_refused", lambda: False)():
                    # the driver's own library is here and the driver did not answer: the
                    # engine, which needs the same driver, cannot list its GPUs either
                    unknown[ANY_GPU] = (f"{why}; and {os.path.basename(engine)} "
                                        "--list-devices lists none without it")
                    notes.append("the GPUs are unknown, not absent: the NVIDIA driver's "
                                 "library is installed but the driver did not answer")
                else:
                    notes.append(f"{engine} --list-devices lists no GPU: engines run on "
                                 "the host")
        else:   # the driver did not answer, and no engine to ask
            why = getattr(gpu, "why_unknown", lambda: "")() or "the GPUs were not asked"
            notes.append(why)
            unknown[ANY_GPU] = why
    total, host_free, host_source = host_figures(placement, proc, cgroup_root)
    if total:
        # MemAvailable says nothing of a bound's share lokid's engines took already: a
        # host bounded to 530 MiB with 490 MiB of engines has 40 MiB free, not 530
        host_free = min(host_free, max(0, total - held.get(HOST, 0)))
        totals[HOST], free[HOST], sources[HOST] = total, host_free, host_source
    else:   # a host of 0 bytes would refuse every preset: left out, and said
        notes.append(f"the host's memory is unknown ({host_source}): set [placement] "
                     "host_memory in lokid.toml to place engines by it")
    devices = []
    for name, t in totals.items():
        used = max(0, t - free[name])
        others = max(0, used - max(0, held.get(name, 0)))
        devices.append(Device(name, t, placement.reserve.get(name, 0), others))
    return Room(tuple(devices), free, sources, tuple(notes), names, processes, uuids,
                unknown)


def explain(room: Room) -> list[str]:
    """One line per device: its total, reserve, what others hold and what is free."""
    lines = []
    for d in room.devices:
        label = f"{d.name} ({room.names[d.name]})" if room.names.get(d.name) else d.name
        text = (f"{label}: {size_text(d.total)}, {size_text(room.free.get(d.name, 0))} free"
                + (f", {size_text(d.reserve)} reserved" if d.reserve else "")
                + (f", {size_text(d.others)} held by other processes" if d.others else ""))
        lines.append(f"{text} (from {room.sources.get(d.name, 'unknown')})")
    return lines + list(room.notes)


def room_json(room: Room) -> list[dict[str, object]]:
    """The devices for ``lokid plan --json`` and the daemon's ``Devices``: bytes, and
    where each figure comes from."""
    return [{"device": d.name, "total": d.total, "free": room.free.get(d.name, 0),
             "reserve": d.reserve, "others": d.others,
             **({"name": room.names[d.name]} if room.names.get(d.name) else {}),
             "source": room.sources.get(d.name, "")} for d in room.devices]
