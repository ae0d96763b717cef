"""lokid.core.place.oomline: the allocation a failed start asked for, and where.

The CPU lines are the real b11434 engine's, under ``ulimit -v 600000`` with ``-c 1000000``
(the tiny test model: tests/dbus/test_daemon_oom.py makes it fail so for real); the GPU
lines are built from the format strings of llama.cpp's ggml (``%.2f MiB on device %d:
cudaMalloc failed``, ``failed to allocate %s buffer of size %zu``): no GPU failure is
recorded here.
"""

from __future__ import annotations

import pytest

from lokid.core.place.oomline import asked, visible_of

CPU = ["0.00.066.070 E ggml_backend_cpu_buffer_type_alloc_buffer: failed to allocate buffer "
       "of size 512098304",
       "0.00.066.081 E ggml_backend_buft_alloc_buffer_n_default: failed to allocate CPU "
       "buffer of size 512098304"]
CUDA = ("ggml_backend_cuda_buffer_type_alloc_buffer: allocating 12945.46 MiB on device 1: "
        "cudaMalloc failed: out of memory")


@pytest.mark.parametrize("line", CPU)
def test_the_real_cpu_lines_are_the_hosts(line: str) -> None:
    assert asked(line) == ("host", 512098304)


def test_gpu_lines_map_through_the_visible_devices() -> None:
    assert asked(CUDA) == ("GPU1", int(12945.46 * 2**20))
    # CUDA_VISIBLE_DEVICES=2,3: the engine's device 1 is the host's GPU3
    assert asked(CUDA, visible_of("2,3")) == ("GPU3", int(12945.46 * 2**20))
    line = "alloc_tensor_range: failed to allocate CUDA0 buffer of size 13574627328"
    assert asked(line, ("5",)) == ("GPU5", 13574627328)
    assert asked("ggml_gallocr_reserve_n: failed to allocate Vulkan1 buffer of size 4096") \
        == ("GPU1", 4096)
    # pinned host memory is the host's
    assert asked("failed to allocate CUDA_Host buffer of size 1024") == ("host", 1024)
    # a GPU named by UUID, or an index past the visible list: not known which
    assert asked(CUDA, ("GPU-8f6a",)) is None and asked(CUDA, ("0",)) is None


@pytest.mark.parametrize("line", [
    "E llama_init_from_model: failed to initialize the context: failed to allocate buffer "
    "for kv cache",                                    # says no size: the lines before do
    "srv  load_model: loading model '/m/failed to allocate CPU buffer of size.gguf'",
    "failed to allocate CPU buffer of size " + "9" * 40,   # no number that long
    "I slot update_slots: id 0 | task 1 | prompt done",
])
def test_other_lines_say_nothing(line: str) -> None:
    assert asked(line) is None
    assert visible_of(None) == () and visible_of(" 1, 2 ") == ("1", "2")
