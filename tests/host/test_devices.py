"""lokid.host.devices: the room of this host's devices.

The host's figures are read from a /proc and a cgroup tree the test writes (the same
text the kernel gives), and from this machine's real /proc. GPUs: no GPU exists here,
so the NVIDIA driver is a stand-in module with pynvml's names whose figures are the
real H200's (shared/recipes, b11434-cuda-h200-*.log: 143155 MiB total, 142629 MiB free
before any engine, the tiny engine at 674 MiB by nvidia-smi); ``--list-devices`` is a
script that prints what llama.cpp's common/arg.cpp prints, and the real CPU engine.
"""

from __future__ import annotations

import os
import types
from pathlib import Path
from typing import Any

from lokid.core.place.settings import PlacementConfig
from lokid.host.devices import explain, host_figures, listed_gpus, read_room, room_json
from lokid.host.nvml import GpuMemory

MiB, GiB = 2**20, 2**30
H200_TOTAL = 143155 * MiB


def fake_proc(tmp_path: Path, total_kib: int, available_kib: int) -> str:
    proc = tmp_path / "proc"
    proc.mkdir(exist_ok=True)
    (proc / "meminfo").write_text(f"MemTotal:       {total_kib} kB\nMemFree:        1 kB\n"
                                  f"MemAvailable:   {available_kib} kB\n")
    return str(proc)


def test_host_from_meminfo_the_slice_and_the_setting(tmp_path: Path) -> None:
    proc = fake_proc(tmp_path, 24 * 2**20, 20 * 2**20)   # 24 GiB, 20 available
    cgroups = tmp_path / "cg"
    total, free, source = host_figures(PlacementConfig(), proc, str(cgroups))
    assert (total, free) == (24 * GiB, 20 * GiB)
    assert source == "/proc/meminfo (MemTotal 24.0 GiB, MemAvailable 20.0 GiB)"
    (cgroups / "loki.slice").mkdir(parents=True)
    (cgroups / "loki.slice" / "memory.max").write_text(f"{8 * GiB}\n")
    (cgroups / "loki.slice" / "memory.current").write_text(f"{3 * GiB}\n")
    total, free, source = host_figures(PlacementConfig(), proc, str(cgroups))
    assert (total, free) == (8 * GiB, 5 * GiB) and "loki.slice MemoryMax=8.0 GiB" in source
    total, free, source = host_figures(PlacementConfig(host_memory=6 * GiB), proc,
                                       str(cgroups))
    assert (total, free) == (6 * GiB, 5 * GiB)
    assert source.endswith("bounded by [placement] host_memory = 6.0 GiB")
    (cgroups / "loki.slice" / "memory.max").write_text("max\n")   # no limit set
    assert host_figures(PlacementConfig(), proc, str(cgroups))[0] == 24 * GiB


def test_this_machines_real_host() -> None:
    total, free, _ = host_figures(PlacementConfig())
    with open("/proc/meminfo") as f:
        first = f.readline().split()
    assert total == int(first[1]) * 1024 and 0 < free <= total


def h200(procs: dict[int, int], fail: bool = False) -> types.ModuleType:
    """pynvml's calls lokid makes, over one H200 with the recorded figures."""
    mod = types.ModuleType("pynvml")

    def memory(handle: int) -> Any:
        if fail:
            raise RuntimeError("GPU is lost")
        used = (143155 - 142629) * MiB + sum(procs.values())
        return types.SimpleNamespace(total=H200_TOTAL, used=used, free=H200_TOTAL - used)

    mod.nvmlInit = lambda: None  # type: ignore[attr-defined]
    mod.nvmlDeviceGetCount = lambda: 1  # type: ignore[attr-defined]
    mod.nvmlDeviceGetHandleByIndex = lambda i: i  # type: ignore[attr-defined]
    mod.nvmlDeviceGetMemoryInfo = memory  # type: ignore[attr-defined]
    mod.nvmlDeviceGetName = lambda h: b"NVIDIA H200"  # type: ignore[attr-defined]
    mod.nvmlDeviceGetComputeRunningProcesses = lambda h: [  # type: ignore[attr-defined]
        types.SimpleNamespace(pid=pid, usedGpuMemory=n) for pid, n in procs.items()]
    return mod


def test_gpus_from_the_driver_with_what_others_hold(tmp_path: Path) -> None:
    proc = fake_proc(tmp_path, 24 * 2**20, 20 * 2**20)
    # lokid's engine (674 MiB, as nvidia-smi said) and another process of 10 GiB
    gpu = GpuMemory(lambda: h200({4242: 674 * MiB, 999: 10 * GiB}))
    room = read_room(PlacementConfig(reserve={"GPU0": 2 * GiB}), gpu_engine=True, gpu=gpu,
                     held={"GPU0": 674 * MiB}, proc=proc, cgroup_root=str(tmp_path / "none"))
    gpu0 = room.devices[0]
    assert (gpu0.name, gpu0.total, gpu0.reserve) == ("GPU0", H200_TOTAL, 2 * GiB)
    # others: the driver's own 526 MiB before any engine, and the 10 GiB process
    assert gpu0.others == 526 * MiB + 10 * GiB
    assert room.free["GPU0"] == (142629 * MiB) - 674 * MiB - 10 * GiB
    assert room.gpus() == ("GPU0",) and room.names["GPU0"] == "NVIDIA H200"
    lines = explain(room)
    assert lines[0] == ("GPU0 (NVIDIA H200): 139.8 GiB, 128.6 GiB free, 2.0 GiB reserved, "
                        "10.5 GiB held by other processes (from the NVIDIA driver (NVML))")
    assert room_json(room)[0]["total"] == H200_TOTAL


def listing_engine(tmp_path: Path, text: str) -> str:
    script = tmp_path / "llama-server"
    script.write_text("#!/bin/sh\n[ \"$1\" = --list-devices ] || exit 9\n"
                      f"cat <<'EOF'\n{text}\nEOF\n")
    script.chmod(0o755)
    return str(script)


def test_without_the_driver_the_engine_lists_its_devices(tmp_path: Path) -> None:
    engine = listing_engine(tmp_path, "Available devices:\n  Vulkan0: llvmpipe (LLVM 15.0.6, "
                            "256 bits) (2048 MiB, 2048 MiB free)\n"
                            "  CUDA1: NVIDIA H200 (143155 MiB, 142629 MiB free)\n")

    def missing() -> types.ModuleType:
        raise ImportError("No module named 'pynvml'")

    room = read_room(PlacementConfig(), engine=engine, gpu_engine=True,
                     gpu=GpuMemory(missing), proc=fake_proc(tmp_path, 2**20, 2**19))
    assert room.gpus() == ("GPU0", "GPU1")
    assert room.free["GPU1"] == 142629 * MiB and room.devices[1].others == 526 * MiB
    assert room.sources["GPU0"] == "llama-server --list-devices"
    assert room.notes[0].startswith("python3-pynvml is not installed")


def test_a_driver_lost_mid_run_falls_back_to_the_engine(tmp_path: Path) -> None:
    engine = listing_engine(tmp_path, "  CUDA0: NVIDIA H200 (143155 MiB, 142629 MiB free)")
    gpu = GpuMemory(lambda: h200({}, fail=True))
    room = read_room(PlacementConfig(), engine=engine, gpu_engine=True, gpu=gpu,
                     proc=fake_proc(tmp_path, 2**20, 2**19))
    assert room.gpus() == ("GPU0",)
    assert room.notes[0].startswith("the NVIDIA driver stopped answering (NVML: GPU is lost)")


def test_an_engine_that_lists_nothing_or_garbage_leaves_the_host(tmp_path: Path) -> None:
    proc = fake_proc(tmp_path, 2**20, 2**19)
    for text in ("Available devices:\n  (none)", "  CUDA0: x (9" + "9" * 30 + " MiB, 1 MiB free)"):
        room = read_room(PlacementConfig(), engine=listing_engine(tmp_path, text),
                         gpu_engine=True, proc=proc)
        assert room.gpus() == () and [d.name for d in room.devices] == ["host"]
        assert room.notes[-1].endswith("--list-devices lists no GPU: engines run on the host")
    room = read_room(PlacementConfig(), engine=str(tmp_path / "missing"), gpu_engine=True,
                     proc=proc)
    assert room.notes[-1].startswith(f"{tmp_path / 'missing'} --list-devices failed: "
                                     "FileNotFoundError")


def test_an_engine_whose_list_fails_leaves_the_gpus_unknown_not_none(tmp_path: Path) -> None:
    """Issue 44, item 10: a CUDA build that cannot start CUDA exits non-zero; its empty
    list was read as "no GPU", and every preset pinned to a GPU refused."""
    from lokid.core.place.policy import ANY_GPU

    script = tmp_path / "llama-server"
    script.write_text("#!/bin/sh\necho 'Available devices:'\n"
                      "echo 'ggml_cuda_init: failed to initialize CUDA: unknown error' >&2\n"
                      "exit 1\n")
    script.chmod(0o755)
    found, why = listed_gpus(str(script))
    assert found == {}
    assert why == (f"{script} --list-devices failed: exit status 1: ggml_cuda_init: failed "
                   "to initialize CUDA: unknown error")

    def missing() -> types.ModuleType:
        raise ImportError("No module named 'pynvml'")

    room = read_room(PlacementConfig(), engine=str(script), gpu_engine=True,
                     gpu=GpuMemory(missing), proc=fake_proc(tmp_path, 2**20, 2**19))
    assert room.gpus() == () and set(room.unknown) == {ANY_GPU}
    assert room.unknown[ANY_GPU].startswith("python3-pynvml is not installed")
    assert room.unknown[ANY_GPU].endswith("exit status 1: ggml_cuda_init: failed to "
                                          "initialize CUDA: unknown error")
    # no engine to ask and no driver: unknown too, and said
    room = read_room(PlacementConfig(), gpu_engine=True, gpu=GpuMemory(missing),
                     proc=fake_proc(tmp_path, 2**20, 2**19))
    assert room.unknown[ANY_GPU].startswith("python3-pynvml is not installed")
    # an engine that answers and lists no GPU is an answer: nothing unknown
    room = read_room(PlacementConfig(), engine=listing_engine(tmp_path, "Available devices:"),
                     gpu_engine=True, gpu=GpuMemory(missing),
                     proc=fake_proc(tmp_path, 2**20, 2**19))
    assert room.unknown == {}


def test_a_cpu_engine_asks_no_gpu(tmp_path: Path) -> None:
    asked = []
    gpu = GpuMemory(lambda: asked.append(1) or h200({}))  # type: ignore[func-returns-value]
    room = read_room(PlacementConfig(), engine="/nonexistent", gpu_engine=False, gpu=gpu)
    assert room.gpus() == () and not asked and not room.notes


def test_the_real_cpu_engine_lists_no_gpu(engine: str) -> None:
    found, why = listed_gpus(engine, {**os.environ})
    assert (found, why) == ({}, "")


def test_an_unreadable_meminfo_leaves_the_host_out_and_says_so(tmp_path: Path) -> None:
    """Seen under lokid.service with ProcSubset=pid (now off): a host of 0 bytes refused
    every preset. Unknown is no device; [placement] host_memory alone still bounds it."""
    proc = tmp_path / "noproc"
    room = read_room(PlacementConfig(), proc=str(proc), cgroup_root=str(tmp_path / "cg"))
    assert room.devices == () and room.notes == (
        f"the host's memory is unknown ({proc}/meminfo unreadable): set [placement] "
        "host_memory in lokid.toml to place engines by it",)
    room = read_room(PlacementConfig(host_memory=GiB), proc=str(proc),
                     cgroup_root=str(tmp_path / "cg"))
    assert [(d.name, d.total) for d in room.devices] == [("host", GiB)]
    assert room.sources["host"] == f"{proc}/meminfo unreadable, bounded by [placement] " \
        "host_memory = 1.0 GiB"


def test_a_gpu_that_vanishes_leaves_the_room_and_its_presets_say_so(tmp_path: Path) -> None:
    """Two H200s, then the driver lists one (GPU1 fell off the bus, as after an Xid
    error): the next reading has GPU0 only; a preset pinned to GPU1 can no longer fit,
    said with its name; gpus = "auto" chooses among what is left."""
    from lokid.core.place.choose import choose
    from lokid.core.place.policy import Need, never_fits

    count = [2]
    mod = h200({})
    mod.nvmlDeviceGetCount = lambda: count[0]  # type: ignore[attr-defined]
    gpu = GpuMemory(lambda: mod)
    proc = fake_proc(tmp_path, 2**20, 2**19)
    none = str(tmp_path / "none")
    before = read_room(PlacementConfig(), gpu_engine=True, gpu=gpu, proc=proc, cgroup_root=none)
    assert before.gpus() == ("GPU0", "GPU1")
    count[0] = 1
    after = read_room(PlacementConfig(), gpu_engine=True, gpu=gpu, proc=proc, cgroup_root=none)
    assert after.gpus() == ("GPU0",) and not after.notes
    pinned = Need("p", {"GPU1": 10 * GiB})
    assert never_fits(pinned, before.devices) == ""
    assert never_fits(pinned, after.devices) == \
        "needs 10.0 GiB on GPU1, which this host does not have"
    assert choose(1, 10 * GiB, dict(after.free)).gpus == ("GPU0",)


def test_a_bounded_host_counts_lokids_engines_in_what_is_free(tmp_path: Path) -> None:
    """host_memory = 530 MiB, MemAvailable 22 GiB, lokid's engines need 490 MiB: 40 MiB
    are free for another (the walk's lokictl top showed 530 before this was fixed)."""
    proc = fake_proc(tmp_path, 24 * 2**20, 22 * 2**20)
    room = read_room(PlacementConfig(host_memory=530 * MiB), held={"host": 490 * MiB},
                     proc=proc, cgroup_root=str(tmp_path / "none"))
    (host,) = room.devices
    assert (host.total, room.free["host"], host.others) == (530 * MiB, 40 * MiB, 0)


def test_a_gpu_backend_that_did_not_start_lists_unknown_gpus_not_none(tmp_path: Path) -> None:
    """Issue 44, item 10: a CUDA build whose backend cannot start CUDA may still exit 0
    with an empty list; its own line says the backend did not start (the format of
    ggml-cuda's ggml_cuda_init in b11434)."""
    from lokid.core.place.policy import ANY_GPU

    engine = listing_engine(tmp_path, "ggml_cuda_init: failed to initialize CUDA: no "
                                      "CUDA-capable device is detected\nAvailable devices:")
    found, why = listed_gpus(engine)
    assert found == {}
    assert why == (f"{engine} --list-devices: its GPU backend did not start (CUDA: no "
                   "CUDA-capable device is detected)")

    def missing() -> types.ModuleType:
        raise ImportError("No module named 'pynvml'")

    room = read_room(PlacementConfig(), engine=engine, gpu_engine=True,
                     gpu=GpuMemory(missing), proc=fake_proc(tmp_path, 2**20, 2**19))
    assert set(room.unknown) == {ANY_GPU}, room
    assert room.unknown[ANY_GPU].endswith("(CUDA: no CUDA-capable device is detected)")
