"""Footprints (lokid.core.place.footprint): what changes the key, where each figure comes
from (a recorded real H200 load's buffer lines, NVML's per-process figure), the
estimate's error, and damaged records ignored."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from lokid.core.place.footprint import (
    BUFFERS,
    CGROUP,
    ESTIMATE,
    NVML,
    OOM,
    Footprint,
    corrected,
    from_json,
    measure,
    memory_key,
    to_json,
)
from lokid.core.place.policy import GIB, HOST
from lokid.core.telemetry.requestlog import EngineLog

LOGS = Path(__file__).resolve().parents[2] / "data" / "engine-logs"
MODEL = ("/srv/models/m.gguf", 3_360_000_000, 1_700_000_000_000_000_000)
BASE = ["/usr/bin/llama-server", "-m", "/srv/models/m.gguf", "--host", "127.0.0.1",
        "--port", "8080", "-c", "8192", "-lv", "4", "-t", "8"]


def test_what_does_not_change_memory_leaves_the_key_alone():
    key = memory_key(BASE, MODEL, "11434")
    moved = ["/opt/other/llama-server", "-m", "/srv/models/m.gguf", "--host", "0.0.0.0",
             "--port=9090", "-c", "8192", "-lv", "3", "-t", "16", "--api-key-file", "/k",
             "--slot-save-path", "/var/lib/loki/slots/x/", "--metrics"]
    assert memory_key(moved, MODEL, "11434") == key


@pytest.mark.parametrize("change", [
    lambda a, m, b: (a[:8] + ["16384"] + a[9:], m, b),          # another context
    lambda a, m, b: (a + ["-ctk", "q8_0"], m, b),                # KV cache type
    lambda a, m, b: (a + ["-ngl", "10"], m, b),                  # layers on the GPU
    lambda a, m, b: (a + ["-md", "/srv/d.gguf"], m, b),          # a draft
    lambda a, m, b: (a + ["--some-new-flag"], m, b),             # a flag lokid does not know
    lambda a, m, b: (a, (m[0], m[1] + 1, m[2]), b),              # the model file rewritten
    lambda a, m, b: (a, (m[0], m[1], m[2] + 1), b),
    lambda a, m, b: (a, m, "11435"),                             # another build
])
def test_what_changes_memory_changes_the_key(change):
    assert memory_key(*change(BASE, MODEL, "11434")) != memory_key(BASE, MODEL, "11434")


def buffers_of(log: str) -> dict[tuple[str, str], float]:
    parsed = EngineLog()
    for line in (LOGS / log).read_text().splitlines():
        parsed.feed(line, 0.0)
    assert parsed.load is not None
    return dict(parsed.load.buffers)


def test_a_recorded_h200_load_gives_the_gpu_figure_from_its_buffer_lines():
    # b11434 with CUDA on an H200 (../shared/recipes): model 3200.41 + KV 256 + compute
    # 112.01 MiB on CUDA0 for the main model, and the MTP context's own KV and compute
    buffers = buffers_of("b11434-cuda-h200-mid_auto.log")
    f = measure("k", buffers=buffers, host_bytes=5 * GIB, estimated={"GPU0": 3 * GIB})
    assert f is not None
    assert set(f.held) == {"GPU0", HOST}
    cuda0 = sum(mib for (dev, _), mib in buffers.items() if dev == "CUDA0")
    assert f.held["GPU0"] == int(cuda0 * 2**20)
    assert 3568 <= f.held["GPU0"] / 2**20 < 3568 + 200   # the breakdown table's 3568 and more
    assert f.sources == {"GPU0": BUFFERS, HOST: CGROUP}
    assert "estimated 3.0 GiB" in f.describe() and "measured: the engine's buffer lines" \
        in f.describe()


def test_the_drivers_figure_is_preferred_to_the_buffer_lines():
    # the tiny preset on the H200: NVML said 674 MiB where the buffer lines sum to 127
    buffers = {("CUDA0", "model"): 100.0, ("CUDA0", "KV"): 27.0, ("CUDA_Host", "compute"): 8.0}
    f = measure("k", nvml={"GPU0 process": 674.0}, buffers=buffers)
    assert f is not None and f.held == {"GPU0": 674 * 2**20} and f.sources == {"GPU0": NVML}
    assert f.describe() == "GPU0 674 MiB (measured by the NVIDIA driver (per process))"


def test_the_error_of_the_estimate_is_shown():
    f = Footprint("k", {"GPU0": int(17.6 * GIB)}, {"GPU0": NVML}, {"GPU0": int(18.2 * GIB)})
    assert f.describe() == ("GPU0 17.6 GiB (measured by the NVIDIA driver (per process); "
                            "estimated 18.2 GiB, +3 %)")
    assert f.measured
    guess = Footprint("k", {"GPU0": GIB}, {"GPU0": ESTIMATE}, {"GPU0": GIB})
    assert not guess.measured and "estimated from the GGUF header)" in guess.describe()


def test_nothing_measured_is_no_footprint_and_garbage_figures_are_dropped():
    assert measure("k") is None
    assert measure("k", nvml={"GPU0 process": float("nan")},
                   buffers={("CPU_Mapped", "model"): 10.0}, host_bytes=-1) is None
    assert measure("k", buffers={("Vulkan1", "model"): 2.0}) == Footprint(
        "k", {"GPU1": 2 * 2**20}, {"GPU1": BUFFERS})


def test_a_start_that_failed_for_memory_raises_the_record():
    f = Footprint("k", {"GPU0": 10 * GIB}, {"GPU0": NVML})
    up = corrected(f, {"GPU0": 16 * GIB})
    assert up.held["GPU0"] == 18 * GIB
    assert corrected(f, {"GPU0": 4 * GIB}).held["GPU0"] == 10 * GIB   # never lowered
    assert up.sources["GPU0"] == OOM and corrected(f, {"GPU0": 4 * GIB}).sources == f.sources


def test_the_first_raise_stops_at_what_the_device_can_hold_the_second_passes_it():
    f = Footprint("k", {"GPU0": 10 * GIB, HOST: GIB}, {"GPU0": ESTIMATE, HOST: CGROUP})
    first = corrected(f, {"GPU0": 79 * GIB}, capacity={"GPU0": 80 * GIB})
    assert first.held == {"GPU0": 80 * GIB, HOST: GIB}
    second = corrected(first, {"GPU0": 80 * GIB}, capacity={"GPU0": 80 * GIB})
    assert second.held["GPU0"] == 90 * GIB   # past the device: it never fits now
    assert from_json(to_json(second)) == second   # the new source reads back


def test_a_record_reads_back_and_a_damaged_one_is_ignored():
    f = Footprint("k", {"GPU0": 5, HOST: 7}, {"GPU0": NVML, HOST: CGROUP}, {"GPU0": 4}, 2.5,
                  1700.0)
    assert from_json(to_json(f)) == f
    good = json.loads(to_json(f))
    for bad in ["", "{", "[]", "null", '"x"', "[" * 100_000,
                json.dumps({**good, "held": {}}),
                json.dumps({**good, "held": {"GPU0": -1}}),
                json.dumps({**good, "held": {"GPU0": 2**60}}),
                json.dumps({**good, "held": {"GPU0": True}}),
                json.dumps({**good, "held": {f"GPU{i}": 1 for i in range(100)}}),
                json.dumps({**good, "sources": {"GPU0": "rumour"}}),
                json.dumps({**good, "load_seconds": "fast"}),
                json.dumps({**good, "key": 3})]:
        assert from_json(bad) is None, bad


def test_buffer_lines_are_booked_on_the_gpu_the_start_sees() -> None:
    """Issue 44, item 5: an engine started with CUDA_VISIBLE_DEVICES=2 prints ``CUDA0``
    (the recorded H200 line's form, ``CUDA0 model buffer size =  3200.41 MiB``); its
    memory is the host's GPU2, not GPU0."""
    from lokid.core.place.footprint import measure, visible_of

    buffers = {("CUDA0", "model"): 3200.41, ("CUDA0", "KV"): 2.0, ("CUDA1", "model"): 1.0,
               ("CUDA_Host", "compute"): 8.52}
    f = measure("k", buffers=buffers, visible=visible_of("2,5"))
    assert f is not None
    assert f.held == {"GPU2": int(3200.41 * 2**20) + int(2.0 * 2**20),
                      "GPU5": int(1.0 * 2**20)}
    # without the variable the backend's index is the host's; by UUID, the driver's name
    assert set(measure("k", buffers=buffers).held) == {"GPU0", "GPU1"}  # type: ignore[union-attr]
    assert set(measure("k", buffers={("CUDA0", "model"): 1.0},  # type: ignore[union-attr]
                       visible=("GPU-8f6a0c2e",)).held) == {"GPU-8f6a0c2e"}
    # Vulkan numbers its devices itself: CUDA_VISIBLE_DEVICES does not renumber them
    assert set(measure("k", buffers={("Vulkan0", "model"): 1.0},  # type: ignore[union-attr]
                       visible=("2",)).held) == {"GPU0"}
