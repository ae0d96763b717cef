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
    # an index past the visible list: not known which
    assert asked(CUDA, ("GPU-8f6a",)) is None and asked(CUDA, ("0",)) is None


def test_a_gpu_pinned_by_uuid_keeps_the_drivers_name() -> None:
    """Issue 44, item 6: a preset with gpus = "GPU-…" got no correction at all."""
    line = "alloc_tensor_range: failed to allocate CUDA0 buffer of size 13574627328"
    assert asked(line, ("GPU-8f6a0c2e-1111",)) == ("GPU-8f6a0c2e-1111", 13574627328)
    assert asked(CUDA, ("MIG-aa", "GPU-bb")) == ("GPU-bb", int(12945.46 * 2**20))


# ggml-cuda.cu b11434, ggml_cuda_error: GGML_CUDA_NAME " error: %s" then
# "  current device: %d, in function %s at %s:%d", as the journal keeps them (prefixed)
COMPUTE_OOM = ["0.12.003.114 E CUDA error: out of memory",
               "0.12.003.120 E   current device: 1, in function ggml_backend_cuda_graph_compute "
               "at /build/llama.cpp/ggml/src/ggml-cuda/ggml-cuda.cu:3912",
               "0.12.003.121 E   cudaGraphLaunch(cuda_ctx->cuda_graph->instance, "
               "cuda_ctx->stream())"]


@pytest.mark.parametrize("visible,device", [((), "GPU1"), (("3", "0"), "GPU0"),
                                            (("GPU-aa", "GPU-bb"), "GPU-bb")])
def test_a_compute_time_out_of_memory_names_its_device(visible: tuple[str, ...],
                                                       device: str) -> None:
    from lokid.core.place.oomline import OomReader

    reader = OomReader()
    found = [reader.feed(line, visible) for line in COMPUTE_OOM]
    assert found == [None, (device, 0), None]


def test_a_compute_time_report_needs_both_lines() -> None:
    from lokid.core.place.oomline import OomReader

    reader = OomReader()
    # the device line without its error line, and the error line followed by another
    assert reader.feed(COMPUTE_OOM[1]) is None
    assert reader.feed(COMPUTE_OOM[0]) is None
    assert reader.feed("I slot update_slots: id 0 | task 1 | prompt done") is None
    assert reader.feed(COMPUTE_OOM[1]) is None
    # cudaGetDevice failed as well: id -1 names no device
    assert reader.feed("CUDA error: out of memory") is None
    assert reader.feed("  current device: -1, in function f at x.cu:1") is None
    # a load-time line still reads as before
    assert reader.feed(CUDA) == ("GPU1", int(12945.46 * 2**20))


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
