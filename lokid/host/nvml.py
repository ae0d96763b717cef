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

Rules, each for a failure seen on a real host (issue 44):

- **Memory as nvidia-smi says it** (NVML's ``nvmlMemory_v2``): v1 counts the driver's
  own reserve in ``used``, so an idle GPU showed hundreds of MiB "held by other
  processes" and placement kept them free for nobody. The reserve is kept apart
  (:attr:`GpuDevice.reserved`) and is no one's room; v1 is read only where the
  driver or the bindings have no v2, and the reserve is then unknown (zero).
- **One GPU that cannot be read is that GPU unknown**, not every GPU gone: a device
  node the sandbox refuses gives that GPU "Insufficient Permissions" while the
  others answer (:attr:`GpuDevice.error`).
- **The driver's refusal in words an operator can act on** (:func:`reason`): "Driver
  Not Loaded" is a host without the driver's nodes (or a sandbox hiding them);
  "Insufficient Permissions" a node this user may not open; "Unknown Error" at
  init is what a device allow-list that refuses the node gives
  (NVIDIA/nvidia-container-toolkit#251), for lokid.service a driver loaded after
  the daemon started.
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
            self._why = reason(_text(e))
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
    used: int                              # by processes (v2; v1: the reserve too)
    processes: Mapping[int, int] = field(default_factory=dict)   # pid → bytes
    reserved: int = 0                      # the driver's own, no one's room (v2)
    uuid: str = ""
    error: str = ""                        # why this GPU could not be read ("" when read)

    @property
    def free(self) -> int:
        return max(0, self.total - self.reserved - self.used)


def _device(nvml: Any, index: int) -> GpuDevice:
    try:
        handle = nvml.nvmlDeviceGetHandleByIndex(index)
    except Exception as e:  # this GPU's node refused or gone: the others may answer
        if not _is_nvml_error(nvml, e):
            raise
        return GpuDevice(index, "", 0, 0, error=reason(_text(e), f"GPU{index}"))
    total, reserved, used = _memory(nvml, handle)
    procs: dict[int, int] = {}
    for proc in nvml.nvmlDeviceGetComputeRunningProcesses(handle):
        nbytes = getattr(proc, "usedGpuMemory", None)
        if isinstance(nbytes, int) and isinstance(proc.pid, int):
            procs[proc.pid] = procs.get(proc.pid, 0) + nbytes
    return GpuDevice(index, _string(nvml, "nvmlDeviceGetName", handle)[:64], total, used,
                     procs, reserved, _string(nvml, "nvmlDeviceGetUUID", handle)[:96])


def _memory(nvml: Any, handle: Any) -> tuple[int, int, int]:
    """(total, reserved, used) in bytes: v2 where the bindings and the driver have it."""
    version = getattr(nvml, "nvmlMemory_v2", None)
    if version is not None:
        try:
            m = nvml.nvmlDeviceGetMemoryInfo(handle, version=version)
            total = int(getattr(m, "total", 0) or 0)
            reserved = min(total, int(getattr(m, "reserved", 0) or 0))
            return total, reserved, min(total - reserved, int(getattr(m, "used", 0) or 0))
        except Exception as e:  # an older driver: no nvmlDeviceGetMemoryInfo_v2
            if not _is_nvml_error(nvml, e):
                raise
    m = nvml.nvmlDeviceGetMemoryInfo(handle)
    total = int(getattr(m, "total", 0) or 0)
    return total, 0, min(total, int(getattr(m, "used", 0) or 0))


def _string(nvml: Any, function: str, handle: Any) -> str:
    try:
        value = getattr(nvml, function)(handle)
    except Exception:   # an old driver without names or UUIDs: the index says which
        return ""
    value = value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)
    return " ".join(value.split())


def _is_nvml_error(nvml: Any, e: BaseException) -> bool:
    kind = getattr(nvml, "NVMLError", None)
    return isinstance(kind, type) and isinstance(e, kind)


def reason(nvml_text: str, what: str = "") -> str:
    """Why NVML did not answer, and what to do, from its error's text."""
    subject = f"the NVIDIA driver refused {what}" if what else "the NVIDIA driver did not answer"
    said = f"{subject} (NVML: {nvml_text})"
    if "Driver Not Loaded" in nvml_text:
        return (f"{said}: no NVIDIA driver is loaded, or this process cannot see its device "
                "nodes (/dev/nvidiactl); on a GPU host, check `nvidia-smi` and that "
                "loki-gpu-nodes.service ran")
    if "Insufficient Permissions" in nvml_text:
        return (f"{said}: this process may not open the GPU's device node "
                "(/dev/nvidia*: its mode, or its unit's DeviceAllow=)")
    if "Unknown Error" in nvml_text and not what:
        return (f"{said}: the device nodes exist but this process may not use them, as "
                "when a unit's device allow-list was set before the driver loaded; "
                "`systemctl restart lokid` after the driver is loaded")
    if "Shared Library Not Found" in nvml_text:
        return (f"{said}: libnvidia-ml.so.1 is not installed (Debian: libnvidia-ml1, from "
                "the NVIDIA driver packages)")
    return said


def _text(e: BaseException) -> str:
    return " ".join(str(e).split()) or type(e).__name__
