"""A preset's footprint: what its engine holds on each device, measured, and what it is
measured for (issue 29, item 2).

**What changes memory.** A footprint holds for one engine command line: the model file
(its path, size and modification time), the build of the engine, and every argument of
the plan but those known not to change what the engine allocates (:data:`NO_MEMORY`:
where it listens, its key, its log, its threads, its timeouts). Any other argument, known
or not (``-c``, ``-ctk``, ``-ngl``, ``-md``, ``--spec-type``, ``-np``, a flag newer than
this list), is part of the key: an edit that changes it makes the footprint unknown again,
and the next load measures it. Erring that way costs one estimate; erring the other way
would place an engine by another's figures.

**Where each figure comes from**, best first, per device:

- a GPU: the NVIDIA driver's per-process figure (NVML: context, cuBLAS workspace and
  every buffer: what the device really lost; on the H200 the tiny model's buffer lines
  summed to 127 MiB and NVML said 674 MiB), else the engine's own buffer lines (model,
  KV, compute: ``-lv 4``), which leave the context out;
- the host: what the engine holds, from the unit's cgroup (``memory.stat``: its own
  memory, the kernel's for it, shmem and the file pages it maps; not the page cache of the
  model file it only read, :mod:`lokid.core.place.held`), else ``MemoryCurrent``;
- before any load: the estimate from the GGUF header (:mod:`lokid.core.place.estimate`).

**Which GPU** (issue 44, item 5). The engine names a device by its backend's index among
the devices it sees (``CUDA0``); with ``CUDA_VISIBLE_DEVICES=2`` that is the host's GPU2,
and lokid names GPUs as the host does (``GPU2``). :func:`engine_gpu` is the one place
that maps one to the other, for the buffer lines here and the out-of-memory lines
(:mod:`lokid.core.place.oomline`): booked on GPU0, an engine on GPU2 made GPU0 look full
and left GPU2's figure an estimate. The variable is CUDA's (ROCm's HIP honours it too);
another backend's index is its own. A GPU named there by UUID (``GPU-…``, ``MIG-…``) is
kept by that name, which only the driver maps to an index.

A record remembers the estimate made before the load, so the error of estimates is seen
("estimated 18.2 GiB, measured 17.6 GiB (-3 %)"). Records are JSON in the state DB; one
that does not read back as one (damage, a newer schema) is ignored and measured again.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from .policy import HOST, size_text

NVML = "nvml"            # the NVIDIA driver, per process
BUFFERS = "buffers"      # the engine's buffer lines (-lv 4)
CGROUP = "cgroup"        # the unit's cgroup: memory.stat (held), else MemoryCurrent
PROCESS = "process"      # the engine's own resident memory (local runner: no cgroup)
ESTIMATE = "estimate"    # the GGUF header
OOM = "oom"              # raised after a start that failed out of memory (corrected())
SOURCES = (NVML, BUFFERS, CGROUP, PROCESS, ESTIMATE, OOM)
SOURCE_WORDS = {
    NVML: "measured by the NVIDIA driver (per process)",
    BUFFERS: "measured: the engine's buffer lines",
    CGROUP: "measured: the engine unit's cgroup",
    PROCESS: "measured: the engine's resident memory",
    ESTIMATE: "estimated from the GGUF header",
    OOM: "raised after a start that failed out of memory",
}

# Arguments that do not change what the engine allocates, with the number of values each
# takes. Everything else is part of the key.
NO_MEMORY: dict[str, int] = {
    "--host": 1, "--port": 1, "--api-key": 1, "--api-key-file": 1, "-a": 1, "--alias": 1,
    "-lv": 1, "--log-verbosity": 1, "--log-file": 1, "--log-colors": 1, "--log-prefix": 0,
    "--log-timestamps": 0, "--verbose": 0, "-v": 0, "-t": 1, "--threads": 1, "-tb": 1,
    "--threads-batch": 1, "--threads-http": 1, "--timeout": 1, "-to": 1, "--metrics": 0,
    "--slots": 0, "--no-slots": 0, "--slot-save-path": 1, "--props": 0, "--no-webui": 0,
    "--webui": 0, "--path": 1, "--ssl-key-file": 1, "--ssl-cert-file": 1, "--prio": 1,
    "--poll": 1, "-C": 1, "--cpu-mask": 1, "-Cr": 1, "--cpu-range": 1,
}
MAX_DEVICES = 64            # a record with more is damaged
MAX_BYTES = 1 << 50         # 1 PiB: a figure beyond it is damaged


def memory_key(argv: Sequence[str], model: tuple[str, int, int], build: str) -> str:
    """What the footprint is measured for: a hash of the arguments that change memory
    (the engine's path left out: ``build`` says which engine), the model file's
    (path, size, mtime_ns) and the engine's build."""
    kept: list[str] = []
    skip = 0
    for arg in argv[1:]:
        if skip:
            skip -= 1
            continue
        name, eq, _ = arg.partition("=")
        if name in NO_MEMORY:
            skip = 0 if eq else NO_MEMORY[name]
            continue
        kept.append(arg)
    text = json.dumps({"argv": kept, "model": list(model), "build": build})
    return hashlib.sha256(text.encode()).hexdigest()[:32]


@dataclass(frozen=True)
class Footprint:
    """What one engine command line holds, in bytes per device, and from where."""

    key: str
    held: Mapping[str, int]                          # device → bytes
    sources: Mapping[str, str] = field(default_factory=dict)   # device → one of SOURCES
    estimated: Mapping[str, int] = field(default_factory=dict)  # the estimate before it
    load_seconds: float | None = None
    at: float = 0.0                                  # wall clock of the measurement

    @property
    def measured(self) -> bool:
        return any(s != ESTIMATE for s in self.sources.values())

    def total(self, gpu_only: bool = False) -> int:
        return sum(n for d, n in self.held.items() if not gpu_only or d != HOST)

    def describe(self) -> str:
        """Per device: the figure and its source, and the estimate's error where both are
        known ("GPU0 17.6 GiB (measured by the NVIDIA driver (per process); estimated
        18.2 GiB, +3 %)")."""
        parts = []
        for device in sorted(self.held, key=lambda d: (d == HOST, d)):
            got = self.held[device]
            source = SOURCE_WORDS.get(self.sources.get(device, ""), "source unknown")
            text = f"{device} {size_text(got)} ({source}"
            guess = self.estimated.get(device)
            if guess is not None and self.sources.get(device) != ESTIMATE and got > 0:
                text += f"; estimated {size_text(guess)}, {error_percent(guess, got):+.0f} %"
            parts.append(text + ")")
        return "; ".join(parts) or "nothing"


def error_percent(estimated: float, measured: float) -> float:
    """How far the estimate was from the measurement, in per cent of the measurement
    (positive: the estimate was larger)."""
    return 100.0 * (estimated - measured) / measured if measured else 0.0


def measure(key: str, *, nvml: Mapping[str, float] | None = None,
            buffers: Mapping[tuple[str, str], float] | None = None,
            host_bytes: int | None = None, host_source: str = CGROUP,
            estimated: Mapping[str, int] | None = None, load_seconds: float | None = None,
            at: float = 0.0, visible: Sequence[str] = ()) -> Footprint | None:
    """The footprint from what was read at a ready load: the driver's MiB per
    ``"GPU<n> process"`` (:mod:`lokid.host.nvml`), the engine's buffer lines in MiB
    per (device, kind) (``CUDA0``, ``CUDA_Host``, ``CPU_Mapped``…: only GPU devices are
    taken from them, named as the host names them through ``visible``, the start's
    CUDA_VISIBLE_DEVICES (:func:`engine_gpu`); host buffers are in the cgroup's figure),
    the host's bytes. None when nothing was measured."""
    held: dict[str, int] = {}
    sources: dict[str, str] = {}
    for label, mib in (nvml or {}).items():
        device = label.split()[0]
        if device.startswith("GPU") and _finite(mib):
            held[device] = held.get(device, 0) + int(mib * 2**20)
            sources[device] = NVML
    if not any(s == NVML for s in sources.values()):
        for (device, _kind), mib in (buffers or {}).items():
            gpu = engine_gpu(device, visible)
            if gpu and _finite(mib):
                held[gpu] = held.get(gpu, 0) + int(mib * 2**20)
                sources[gpu] = BUFFERS
    if host_bytes is not None and 0 <= host_bytes < MAX_BYTES:
        held[HOST] = host_bytes
        sources[HOST] = host_source
    if not held:
        return None
    return Footprint(key, held, sources, dict(estimated or {}), load_seconds, at)


def _finite(x: float) -> bool:
    return isinstance(x, (int, float)) and math.isfinite(x) and 0 <= x < MAX_BYTES / 2**20


def gpu_of_device(device: str) -> str:
    """``CUDA0`` → ``GPU0``, ``Vulkan1`` → ``GPU1``, ``ROCm0`` → ``GPU0``; "" for the
    host's buffers (``CPU``, ``CPU_Mapped``, ``CUDA_Host``, ``Vulkan_Host``…). The index
    is the backend's, which is NVML's where ``CUDA_DEVICE_ORDER=PCI_BUS_ID``."""
    for prefix in ("CUDA", "ROCm", "Vulkan", "SYCL", "MUSA", "CANN", "Metal"):
        if device.startswith(prefix):
            rest = device[len(prefix):]
            return f"GPU{int(rest)}" if rest.isdigit() and len(rest) < 4 else ""
    return ""


# The backends whose device indices CUDA_VISIBLE_DEVICES renumbers.
VISIBLE_BACKENDS = ("CUDA", "ROCm")


def visible_of(env_value: str | None) -> tuple[str, ...]:
    """CUDA_VISIBLE_DEVICES as a sequence of its items (() when unset)."""
    if not env_value:
        return ()
    return tuple(s.strip() for s in env_value.split(",") if s.strip())


def engine_gpu(device: str, visible: Sequence[str] = ()) -> str:
    """The host's name of an engine's device: ``CUDA0`` with ``visible`` ("2",) (the
    start's CUDA_VISIBLE_DEVICES, :func:`visible_of`) → ``GPU2``; with ("GPU-8f6a…",) →
    ``GPU-8f6a…`` (the driver's own name of it); without ``visible`` → ``GPU0``. "" for
    the host's buffers and for an index past ``visible`` (which GPU is not known)."""
    gpu = gpu_of_device(device)
    if not gpu or not visible or not device.startswith(VISIBLE_BACKENDS):
        return gpu
    index = int(gpu[3:])
    if index >= len(visible):
        return ""
    item = visible[index]
    if item.isdigit() and len(item) < 4:
        return f"GPU{int(item)}"
    return item if item.startswith(("GPU-", "MIG-")) and len(item) <= 64 else ""


def corrected(old: Footprint, failed_on: Mapping[str, int],
              capacity: Mapping[str, int] | None = None) -> Footprint:
    """The record after a start that failed for memory anyway (issue 29, item 5):
    ``failed_on`` is, per device, a lower bound of what it needs (what the device had
    free for it, or the allocation that failed, whichever is larger); its source says why.

    Where ``capacity`` (what each device holds with every other engine gone) is known,
    the first failure raises the figure to it: all the device can hold. A lower bound
    says nothing of how much more the engine needs, and raising it to the bound plus an
    eighth let each next start evict a few more idle engines and fail again (issue 45,
    item 13: 4 failed starts and 11 evictions of healthy engines before the preset was
    known never to fit): now its next start evicts what it must in one round, and has
    all the room. Not past it: a figure read while something else was loading would
    otherwise refuse the preset for good. A record already at that bound that fails
    again is raised past it (to the bound plus an eighth): the preset then never fits
    and is refused with the figures, never started again. Without a capacity, the
    figure is raised to the lower bound plus an eighth."""
    held, sources = dict(old.held), dict(old.sources)
    for device, lower in failed_on.items():
        was = held.get(device, 0)
        raised = lower + lower // 8
        cap = (capacity or {}).get(device)
        if cap is not None and was < cap:
            raised = cap
        elif cap is not None:
            raised = max(raised, cap + cap // 8)
        if raised > was:
            held[device], sources[device] = raised, OOM
    return Footprint(old.key, held, sources, old.estimated, old.load_seconds, old.at)


def to_json(f: Footprint) -> str:
    return json.dumps({"key": f.key, "held": dict(f.held), "sources": dict(f.sources),
                       "estimated": dict(f.estimated), "load_seconds": f.load_seconds,
                       "at": f.at}, sort_keys=True)


def from_json(text: str) -> Footprint | None:
    """The record, or None when the text is not one (damaged, another schema): the
    caller measures again."""
    try:
        data: Any = json.loads(text)
    except (ValueError, RecursionError):
        return None
    if not isinstance(data, dict) or not isinstance(data.get("key"), str):
        return None
    held = _sizes(data.get("held"))
    estimated = _sizes(data.get("estimated", {}))
    sources = data.get("sources", {})
    if held is None or not held or estimated is None or not isinstance(sources, dict) \
            or any(not isinstance(v, str) or v not in SOURCES for v in sources.values()):
        return None
    load = data.get("load_seconds")
    if load is not None and (not isinstance(load, (int, float)) or isinstance(load, bool)
                             or not math.isfinite(load) or load < 0):
        return None
    at = data.get("at", 0.0)
    if not isinstance(at, (int, float)) or isinstance(at, bool) or not math.isfinite(at):
        return None
    return Footprint(data["key"], held, {str(k): v for k, v in sources.items()}, estimated,
                     None if load is None else float(load), float(at))


def _sizes(value: object) -> dict[str, int] | None:
    if not isinstance(value, dict) or len(value) > MAX_DEVICES:
        return None
    out: dict[str, int] = {}
    for k, v in value.items():
        if not isinstance(k, str) or not isinstance(v, int) or isinstance(v, bool) \
                or not 0 <= v < MAX_BYTES:
            return None
        out[k] = v
    return out
