"""lokid.core.place.room: device lists, /proc/meminfo, cgroup and systemd limits, reserves.

The device lines are the shapes b11434 prints (its CPU build here, the Vulkan and
CUDA logs in /work/shared/recipes/engine-logs); hostile input must give figures or
nothing, never an exception nor a device with more memory than a real one.
"""

from __future__ import annotations

import pytest

from lokid.core.place.room import (
    MAX_DEVICES,
    UINT64_MAX,
    ListedDevice,
    MemInfo,
    host_room,
    memory_max_property,
    parse_cgroup_bytes,
    parse_devices,
    parse_meminfo,
    with_reserve,
)

MiB = 2**20
GiB = 2**30


def test_cpu_build_lists_none() -> None:
    assert parse_devices("Available devices:\n  (none)\n") == []


@pytest.mark.parametrize(("line", "device"), [
    ("  CUDA0: NVIDIA H200 (143155 MiB, 142629 MiB free)",
     ListedDevice("CUDA0", "CUDA", "NVIDIA H200", 143155 * MiB, 142629 * MiB)),
    ("  Vulkan0: llvmpipe (LLVM 15.0.6, 256 bits) (2048 MiB, 2048 MiB free)",
     ListedDevice("Vulkan0", "Vulkan", "llvmpipe (LLVM 15.0.6, 256 bits)",
                  2048 * MiB, 2048 * MiB)),
    # device_info in a -lv 4 log: read once the caller has cut the log prefix
    ("0.00.200.864 I cmn  common_param:   - CUDA0   : NVIDIA H200 (143155 MiB, 142629 MiB free)",
     None),
    ("  - CUDA0   : NVIDIA H200 (143155 MiB, 142629 MiB free)",
     ListedDevice("CUDA0", "CUDA", "NVIDIA H200", 143155 * MiB, 142629 * MiB)),
    ("  - CPU     : AMD EPYC (24105 MiB, 24105 MiB free)",
     ListedDevice("CPU", "CPU", "AMD EPYC", 24105 * MiB, 24105 * MiB)),
    # free above total: a torn read must not create room
    ("  CUDA1: X (100 MiB, 200 MiB free)",
     ListedDevice("CUDA1", "CUDA", "X", 100 * MiB, 100 * MiB)),
])
def test_device_lines(line: str, device: ListedDevice | None) -> None:
    assert parse_devices(line) == ([] if device is None else [device])


def test_a_whole_listing_in_order_first_of_a_name_kept() -> None:
    text = ("ggml_cuda_init: found 2 CUDA devices:\nAvailable devices:\n"
            "  CUDA0: NVIDIA H200 (143155 MiB, 142629 MiB free)\n"
            "  CUDA1: NVIDIA H200 (143155 MiB, 100000 MiB free)\n"
            "  CUDA0: again (1 MiB, 1 MiB free)\n")
    got = parse_devices(text)
    assert [(d.name, d.free_bytes) for d in got] == [("CUDA0", 142629 * MiB),
                                                    ("CUDA1", 100000 * MiB)]


@pytest.mark.parametrize("hostile", [
    "", "\x00\xff garbage", b"\x00\xff\xfe\xfa binary (12 MiB, 1 MiB free)",
    "  CUDA0: X (" + "9" * 10_000 + " MiB, 1 MiB free)",
    "  CUDA0: X (" + "9" * 25 + " MiB, 1 MiB free)",     # short enough a line, too many digits
    "  CUDA0: X (-5 MiB, 1 MiB free)",
    "  CUDA0: X (5 MiB, -1 MiB free)",
    "  CUDA0: " + "(" * 5000 + " (5 MiB, 1 MiB free)",
    "  0CUDA: X (5 MiB, 1 MiB free)",
])
def test_hostile_device_listings_give_nothing(hostile: str | bytes) -> None:
    assert parse_devices(hostile) == []


def test_device_numbers_are_bounded() -> None:
    # 20 digits parse (an absurd but finite figure the policy will see as such); the
    # listing is cut at MAX_DEVICES.
    (d,) = parse_devices("  CUDA0: X (99999999999999999999 MiB, 1 MiB free)")
    assert d.total_bytes == 99999999999999999999 * MiB and d.free_bytes == MiB
    many = "\n".join(f"  CUDA{i}: X (1 MiB, 1 MiB free)" for i in range(500))
    assert len(parse_devices(many)) == MAX_DEVICES


MEMINFO = """MemTotal:       131921952 kB
MemFree:         1000000 kB
MemAvailable:   120000000 kB
Buffers:          200000 kB
Cached:          9000000 kB
HugePages_Total:       0
"""


@pytest.mark.parametrize(("text", "expected"), [
    (MEMINFO, MemInfo(131921952 * 1024, 120000000 * 1024)),
    # before Linux 3.14: no MemAvailable
    (MEMINFO.replace("MemAvailable:   120000000 kB\n", ""),
     MemInfo(131921952 * 1024, 10200000 * 1024)),
    ("", MemInfo(0, 0)),
    (b"\x00\xff\xfe", MemInfo(0, 0)),
    ("MemTotal: " + "9" * 10_000 + " kB\nMemAvailable: 5 kB", MemInfo(0, 0)),
    ("MemTotal: -5 kB\nMemAvailable: 5 kB", MemInfo(0, 0)),
    ("MemTotal: 10 kB\nMemAvailable: 50 kB", MemInfo(10240, 10240)),
])
def test_meminfo(text: str | bytes, expected: MemInfo) -> None:
    assert parse_meminfo(text) == expected


@pytest.mark.parametrize(("text", "expected"), [
    ("max\n", None), ("8589934592\n", 8 * GiB), ("0", 0), ("", None), ("-1", None),
    ("9" * 10_000, None), (b"\xff\x00", None), ("12 34", None), ("١٢٣", None),
    (str(UINT64_MAX), None), (str(UINT64_MAX - 1), UINT64_MAX - 1),
])
def test_cgroup_bytes(text: str | bytes, expected: int | None) -> None:
    assert parse_cgroup_bytes(text) == expected


@pytest.mark.parametrize(("value", "expected"), [
    (UINT64_MAX, None), (8 * GiB, 8 * GiB), (0, 0), (-1, None), (2**70, None),
    (True, None), ("8G", None), (None, None),
])
def test_memory_max_property(value: object, expected: int | None) -> None:
    assert memory_max_property(value) == expected


@pytest.mark.parametrize(("available", "limits", "used", "expected"), [
    (100 * GiB, (), 0, 100 * GiB),
    (100 * GiB, (None, None), 5 * GiB, 100 * GiB),
    (100 * GiB, (32 * GiB, None), 20 * GiB, 12 * GiB),       # the slice's MemoryMax binds
    (10 * GiB, (32 * GiB,), 20 * GiB, 10 * GiB),             # MemAvailable binds
    (100 * GiB, (32 * GiB, 24 * GiB), 20 * GiB, 4 * GiB),    # the tighter limit
    (100 * GiB, (16 * GiB,), 20 * GiB, 0),                   # over its limit: none, not < 0
    (100 * GiB, (16 * GiB,), -5, 16 * GiB),
])
def test_host_room(available: int, limits: tuple[int | None, ...], used: int,
                   expected: int) -> None:
    assert host_room(MemInfo(200 * GiB, available), limits, used) == expected


def test_reserve() -> None:
    room = {"GPU0": 80 * GiB, "GPU1": 1 * GiB, "host": 64 * GiB}
    got = with_reserve(room, {"GPU0": 2 * GiB, "GPU1": 4 * GiB, "host": -1}, default=GiB // 2)
    assert got == {"GPU0": 78 * GiB, "GPU1": 0, "host": 64 * GiB}
    assert with_reserve(room, {}, default=GiB)["host"] == 63 * GiB
