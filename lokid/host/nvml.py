"""GPU memory per process from the NVIDIA driver (NVML), where the engine's log says none.

The engine prints its buffer sizes per device only at ``-lv 4`` (lokid sets it
where automatic speculation on a GPU engine needs the offload lines). Elsewhere the
daemon asks the driver: NVML's list of compute processes per GPU, with the memory
each uses, summed over the engine's processes. NVML comes from Python bindings that
lokid does not require: Debian's ``python3-pynvml`` (contrib) or PyPI's
``nvidia-ml-py``, both the module ``pynvml``. Without them, or without a driver,
the figures are unknown and :meth:`GpuMemory.why_unknown` says why, in words an
operator can act on.

Devices are named ``GPU<n>`` with NVML's index (``nvidia-smi``'s numbering, PCI bus
order), which is not always llama.cpp's ``CUDA<n>`` (CUDA orders the fastest
first unless ``CUDA_DEVICE_ORDER=PCI_BUS_ID``); the kind is ``process``: all the
process holds on that GPU, every buffer together. Process ids are the host's: a
daemon in a container with its own pid namespace sees none of its engines.

Calls into the driver can block (a busy or resetting GPU): the daemon makes them in
a worker thread, a few seconds apart.
"""

from __future__ import annotations

import importlib
import threading
import time
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

MIB = 1024 * 1024
RETRY_AFTER = 60.0  # a missing module or driver is looked for again after this long

NOT_INSTALLED = ("python3-pynvml is not installed (Debian contrib; or nvidia-ml-py from "
                 "PyPI): lokid cannot ask the NVIDIA driver")


def _import() -> ModuleType:
    return importlib.import_module("pynvml")


class GpuMemory:
    """The NVIDIA driver's per-process GPU memory, for any set of process ids."""

    def __init__(self, load: Callable[[], ModuleType] = _import,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._load = load
        self._clock = clock
        self._nvml: Any = None
        self._why = ""
        self._tried = float("-inf")
        self._lock = threading.Lock()

    def why_unknown(self) -> str:
        """Why the driver cannot be asked ("" when it can, or before the first try)."""
        return self._why

    def _ready(self) -> Any:
        if self._nvml is not None:
            return self._nvml
        now = self._clock()
        if now - self._tried < RETRY_AFTER:
            return None
        self._tried = now
        try:
            nvml = self._load()
        except ImportError:
            self._why = NOT_INSTALLED
            return None
        try:
            nvml.nvmlInit()
        except Exception as e:  # pynvml.NVMLError and its many subclasses
            self._why = f"the NVIDIA driver did not answer (NVML: {_text(e)})"
            return None
        self._nvml, self._why = nvml, ""
        return nvml

    def used(self, pids: Collection[int]) -> dict[str, float] | None:
        """MiB per ``"GPU<n> process"`` held by ``pids`` together; {} when none of them
        holds GPU memory; None when the driver cannot be asked (:meth:`why_unknown`)."""
        with self._lock:
            nvml = self._ready()
            if nvml is None:
                return None
            wanted = set(pids)
            out: dict[str, float] = {}
            try:
                for index in range(nvml.nvmlDeviceGetCount()):
                    handle = nvml.nvmlDeviceGetHandleByIndex(index)
                    for proc in nvml.nvmlDeviceGetComputeRunningProcesses(handle):
                        used = getattr(proc, "usedGpuMemory", None)
                        if proc.pid in wanted and isinstance(used, int):
                            key = f"GPU{index} process"
                            out[key] = out.get(key, 0.0) + used / MIB
            except Exception as e:  # the driver went away (a reset, an unload)
                self._why = f"the NVIDIA driver stopped answering (NVML: {_text(e)})"
                self._nvml, self._tried = None, self._clock()
                return None
            return out

    def devices(self) -> list[GpuDevice] | None:
        """Each GPU's memory and the processes that hold some (issue 29: the room of
        each device, and what processes lokid does not manage hold); None when the
        driver cannot be asked (:meth:`why_unknown`)."""
        with self._lock:
            nvml = self._ready()
            if nvml is None:
                return None
            try:
                return [_device(nvml, i) for i in range(min(64, nvml.nvmlDeviceGetCount()))]
            except Exception as e:  # the driver went away (a reset, an unload)
                self._why = f"the NVIDIA driver stopped answering (NVML: {_text(e)})"
                self._nvml, self._tried = None, self._clock()
                return None


@dataclass(frozen=True)
class GpuDevice:
    """One GPU as the driver sees it (``nvmlDeviceGetMemoryInfo``), in bytes."""

    index: int
    name: str
    total: int
    used: int                              # by every process, the driver's own share too
    processes: Mapping[int, int] = field(default_factory=dict)   # pid → bytes

    @property
    def free(self) -> int:
        return max(0, self.total - self.used)


def _device(nvml: Any, index: int) -> GpuDevice:
    handle = nvml.nvmlDeviceGetHandleByIndex(index)
    memory = nvml.nvmlDeviceGetMemoryInfo(handle)
    total = int(getattr(memory, "total", 0) or 0)
    used = min(total, int(getattr(memory, "used", 0) or 0))
    try:
        name = nvml.nvmlDeviceGetName(handle)
        name = name.decode("utf-8", "replace") if isinstance(name, bytes) else str(name)
    except Exception:   # an old driver without names: the index says which
        name = ""
    procs: dict[int, int] = {}
    for proc in nvml.nvmlDeviceGetComputeRunningProcesses(handle):
        nbytes = getattr(proc, "usedGpuMemory", None)
        if isinstance(nbytes, int) and isinstance(proc.pid, int):
            procs[proc.pid] = procs.get(proc.pid, 0) + nbytes
    return GpuDevice(index, " ".join(name.split())[:64], total, used, procs)


def _text(e: BaseException) -> str:
    return " ".join(str(e).split()) or type(e).__name__
