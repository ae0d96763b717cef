"""lokid.host.nvml: GPU memory per process from the NVIDIA driver.

No NVIDIA driver exists here, and no NVML output was ever recorded for this project
(``../shared/recipes`` has engine logs only): so the real ``pynvml`` (nvidia-ml-py,
a test dependency) is tested for what it really does on this machine, failing to
find the driver; and the summing of per-process figures runs against a stand-in
module with pynvml's names and shapes (``nvmlDeviceGetComputeRunningProcesses``
returns objects with ``pid`` and ``usedGpuMemory``, None where the driver does not
know), whose figures are invented. Its correctness on a real GPU is unverified.
"""

from __future__ import annotations

import types
from typing import Any

import pytest

from lokid.host import nvml
from lokid.host.nvml import NOT_INSTALLED, GpuMemory


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_the_real_pynvml_without_a_driver_says_so_and_tries_again_a_minute_later() -> None:
    pytest.importorskip("pynvml", reason="nvidia-ml-py is a test dependency: make setup")
    clock = Clock()
    loads = []

    def load() -> types.ModuleType:
        import pynvml
        loads.append(1)
        return pynvml

    gpu = GpuMemory(load, clock)
    assert gpu.why_unknown() == ""
    assert gpu.used([1234]) is None
    assert gpu.why_unknown() == ("the NVIDIA driver did not answer (NVML: NVML Shared Library "
                                 "Not Found): libnvidia-ml.so.1 is not installed (Debian: "
                                 "libnvidia-ml1, from the NVIDIA driver packages)")
    clock.now += 30
    assert gpu.used([1234]) is None and len(loads) == 1  # not asked again yet
    clock.now += 31
    assert gpu.used([1234]) is None and len(loads) == 2


def test_without_the_bindings_the_reason_names_the_package() -> None:
    def load() -> types.ModuleType:
        raise ImportError("No module named 'pynvml'")

    gpu = GpuMemory(load, Clock())
    assert gpu.used([1]) is None
    assert gpu.why_unknown() == NOT_INSTALLED
    assert "python3-pynvml" in NOT_INSTALLED


def stand_in(devices: list[list[tuple[int, Any]]], fail_after: int | None = None
             ) -> types.ModuleType:
    """pynvml's functions that lokid calls, over ``devices`` (per GPU: (pid, bytes))."""
    calls = {"n": 0}
    mod = types.ModuleType("pynvml")

    def processes(handle: int) -> list[Any]:
        calls["n"] += 1
        if fail_after is not None and calls["n"] > fail_after:
            raise RuntimeError("GPU is lost")
        return [types.SimpleNamespace(pid=pid, usedGpuMemory=used, gpuInstanceId=0)
                for pid, used in devices[handle]]

    mod.nvmlInit = lambda: None  # type: ignore[attr-defined]
    mod.nvmlDeviceGetCount = lambda: len(devices)  # type: ignore[attr-defined]
    mod.nvmlDeviceGetHandleByIndex = lambda i: i  # type: ignore[attr-defined]
    mod.nvmlDeviceGetComputeRunningProcesses = processes  # type: ignore[attr-defined]
    return mod


def test_the_engines_processes_summed_per_gpu_and_nobody_elses() -> None:
    mib = nvml.MIB
    driver = stand_in([
        [(100, 900 * mib), (555, 4000 * mib), (101, 20 * mib)],  # GPU0: engine, other, child
        [(100, 2048 * mib)],                                     # GPU1: a split model
        [(101, None)],                                           # GPU2: not known
        [],
    ])
    gpu = GpuMemory(lambda: driver, Clock())
    assert gpu.used([100, 101]) == {"GPU0 process": 920.0, "GPU1 process": 2048.0}
    assert gpu.used([42]) == {}          # a CPU engine: none on any GPU
    assert gpu.why_unknown() == ""


def test_a_driver_that_stops_answering_is_asked_again_a_minute_later() -> None:
    clock = Clock()
    driver = stand_in([[(7, 1 << 30)]], fail_after=1)
    gpu = GpuMemory(lambda: driver, clock)
    assert gpu.used([7]) == {"GPU0 process": 1024.0}
    assert gpu.used([7]) is None
    assert gpu.why_unknown() == "the NVIDIA driver stopped answering (NVML: GPU is lost)"
    clock.now += 61
    assert gpu.used([7]) is None  # asked again (and failing again, here)
