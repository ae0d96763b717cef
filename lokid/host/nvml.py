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

**MIG** (issue 44, item 8). A GPU in MIG mode is split into instances, each with its
own memory; a process (an engine whose ``CUDA_VISIBLE_DEVICES`` names a ``MIG-…`` UUID)
can use its instance's memory and no more, and NVML's memory of the GPU itself is the
whole card's. So where ``nvmlDeviceGetMigMode`` says MIG is on, each instance is read
through its own handle (``nvmlDeviceGetMaxMigDeviceCount`` slots, each
``nvmlDeviceGetMigDeviceHandleByIndex``; an empty slot is NVML_ERROR_NOT_FOUND and
skipped) for its memory, name, UUID and processes, and the GPU itself is listed with
:attr:`GpuDevice.mig_mode` set and is nobody's room: offered whole, a preset would have
been placed into memory it can never reach. Naming: a whole GPU stays ``GPU<n>`` (NVML's
index, as docs/presets.md promises); an instance is ``GPU<n>/MIG<k>``, ``k`` being NVML's
index of the instance under its GPU (the slot it was read at), so that the GPU it
belongs to is in its name, and no ``GPU<m>`` of another card can be mistaken for it.
Operators name an instance by its UUID (``gpus = "MIG-…"``, what CUDA reads); the name is
what lokid shows and books it by. A GPU whose MIG mode cannot be asked (an old driver or
binding: NVML_ERROR_NOT_SUPPORTED, no such function) is a whole GPU, as before.

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

    def driver_refused(self) -> bool:
        """Whether the driver's library is here but the driver did not answer (not loaded,
        its nodes hidden or refused): a host meant to have NVIDIA GPUs, whose GPUs are
        then unknown rather than absent."""
        return bool(self._why) and self._why != NOT_INSTALLED and \
            "Shared Library Not Found" not in self._why

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
                    # on a MIG GPU, each instance's processes: booked where they are
                    for slot, h in (_instances(nvml, handle) if _mig_on(nvml, handle)
                                    else [(-1, handle)]):
                        name = device_name(index, slot)
                        for proc in nvml.nvmlDeviceGetComputeRunningProcesses(h):
                            used = getattr(proc, "usedGpuMemory", None)
                            if proc.pid in wanted and isinstance(used, int):
                                key = f"{name} process"
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
                return [d for i in range(min(64, nvml.nvmlDeviceGetCount()))
                        for d in _device(nvml, i)]
            except Exception as e:  # the driver went away (a reset, an unload)
                self._why = f"the NVIDIA driver stopped answering (NVML: {_text(e)})"
                self._nvml, self._tried = None, self._clock()
                return None


def device_name(index: int, mig: int = -1) -> str:
    """``GPU<index>`` for a whole GPU, ``GPU<index>/MIG<mig>`` for a MIG instance."""
    return f"GPU{index}" if mig < 0 else f"GPU{index}/MIG{mig}"


@dataclass(frozen=True)
class GpuDevice:
    """One GPU, or one MIG instance of a GPU, as the driver sees it
    (``nvmlDeviceGetMemoryInfo``), in bytes."""

    index: int
    name: str
    total: int
    used: int                              # by processes (v2; v1: the reserve too)
    processes: Mapping[int, int] = field(default_factory=dict)   # pid → bytes
    reserved: int = 0                      # the driver's own, no one's room (v2)
    uuid: str = ""
    error: str = ""                        # why this GPU could not be read ("" when read)
    mig: int = -1                          # a MIG instance: its index under GPU ``index``
    mig_mode: bool = False                 # a whole GPU in MIG mode: its instances are room

    @property
    def free(self) -> int:
        return max(0, self.total - self.reserved - self.used)

    @property
    def label(self) -> str:
        """How lokid names it: ``GPU0``, ``GPU0/MIG2`` (see the module docstring)."""
        return device_name(self.index, self.mig)


def _device(nvml: Any, index: int) -> list[GpuDevice]:
    """GPU ``index``: itself, and where it is in MIG mode each of its instances."""
    try:
        handle = nvml.nvmlDeviceGetHandleByIndex(index)
    except Exception as e:  # this GPU's node refused or gone: the others may answer
        if not _is_nvml_error(nvml, e):
            raise
        return [GpuDevice(index, "", 0, 0, error=reason(_text(e), f"GPU{index}"))]
    whole = _read(nvml, index, handle)
    if not _mig_on(nvml, handle):
        return [whole]
    try:
        instances = _instances(nvml, handle)
    except Exception as e:  # its instances cannot be listed: the GPU unknown, not whole
        if not _is_nvml_error(nvml, e):
            raise
        return [GpuDevice(index, whole.name, 0, 0, uuid=whole.uuid, mig_mode=True,
                          error=reason(_text(e), f"GPU{index}'s MIG instances"))]
    out = [GpuDevice(index, whole.name, whole.total, whole.used, whole.processes,
                     whole.reserved, whole.uuid, mig_mode=True)]
    for slot, h in instances:
        try:
            out.append(_read(nvml, index, h, slot))
        except Exception as e:  # this instance unreadable: the others may answer
            if not _is_nvml_error(nvml, e):
                raise
            out.append(GpuDevice(index, "", 0, 0, mig=slot,
                                 error=reason(_text(e), device_name(index, slot))))
    return out


def _read(nvml: Any, index: int, handle: Any, mig: int = -1) -> GpuDevice:
    total, reserved, used = _memory(nvml, handle)
    procs: dict[int, int] = {}
    for proc in nvml.nvmlDeviceGetComputeRunningProcesses(handle):
        nbytes = getattr(proc, "usedGpuMemory", None)
        if isinstance(nbytes, int) and isinstance(proc.pid, int):
            procs[proc.pid] = procs.get(proc.pid, 0) + nbytes
    return GpuDevice(index, _string(nvml, "nvmlDeviceGetName", handle)[:64], total, used,
                     procs, reserved, _string(nvml, "nvmlDeviceGetUUID", handle)[:96], mig=mig)


def _mig_on(nvml: Any, handle: Any) -> bool:
    """Whether the GPU is in MIG mode now (its current mode; a pending one takes effect at
    the GPU's reset). No: a GPU without MIG (NVML_ERROR_NOT_SUPPORTED), a driver or
    binding too old to say."""
    ask = getattr(nvml, "nvmlDeviceGetMigMode", None)
    if ask is None:
        return False
    try:
        current = ask(handle)[0]
    except Exception as e:
        if not _is_nvml_error(nvml, e):
            raise
        return False
    return bool(current == getattr(nvml, "NVML_DEVICE_MIG_ENABLE", 1))


MAX_MIG = 64   # slots asked at most per GPU (an A100 or H100 has 7)


def _instances(nvml: Any, handle: Any) -> list[tuple[int, Any]]:
    """The MIG instances of a GPU in MIG mode: (their index under it, handle), empty
    slots (NVML_ERROR_NOT_FOUND) left out. NVML errors other than that raise."""
    not_found = getattr(nvml, "NVML_ERROR_NOT_FOUND", 6)
    out = []
    for slot in range(min(MAX_MIG, int(nvml.nvmlDeviceGetMaxMigDeviceCount(handle)))):
        try:
            out.append((slot, nvml.nvmlDeviceGetMigDeviceHandleByIndex(handle, slot)))
        except Exception as e:
            if not _is_nvml_error(nvml, e) or getattr(e, "value", None) != not_found:
                raise
    return out


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
