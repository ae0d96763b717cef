"""What an engine's allocation failure asked for, and on which device (issue 29, item 5).

A start that fails for memory says so in the engine's log before it exits; the daemon
reads each such line to raise the preset's footprint record
(:func:`lokid.core.place.footprint.corrected`). The lines, as the real b11434 CPU
engine printed them under an address-space limit (``-c 1000000`` for the tiny test
model)::

    E ggml_aligned_malloc: insufficient memory (attempted to allocate 488.38 MB)
    E ggml_backend_cpu_buffer_type_alloc_buffer: failed to allocate buffer of size 512098304
    E ggml_backend_buft_alloc_buffer_n_default: failed to allocate CPU buffer of size 512098304
    E llama_init_from_model: failed to initialize the context: failed to allocate buffer
      for kv cache                                                (one line, cut here)

and on a GPU, from the format strings of llama.cpp's ggml (no real GPU failure is
recorded here)::

    ggml_backend_cuda_buffer_type_alloc_buffer: allocating 12945.46 MiB on device 0:
      cudaMalloc failed: out of memory                            (one line, cut here)
    alloc_tensor_range: failed to allocate CUDA0 buffer of size 13574627328
    ggml_gallocr_reserve_n: failed to allocate Vulkan1 buffer of size 402653184

A device index is the backend's among the devices the engine sees: with
``CUDA_VISIBLE_DEVICES=2,3`` its device 0 is the host's GPU2, so ``visible`` (that
variable's items) maps it back, by :func:`lokid.core.place.footprint.engine_gpu`, the
one home of that mapping; a GPU named there by UUID keeps that name (issue 44, item 6:
a preset pinned by UUID got no correction at all). Host buffers (``CPU``,
``CUDA_Host``…) are the host's.

A failure at compute time (issue 44, item 6), while serving or reserving, is ggml-cuda's
error report (``ggml_cuda_error``, ``ggml-cuda.cu`` b11434: ``GGML_CUDA_NAME " error:
%s"`` then ``"  current device: %d, in function %s at %s:%d"``), two lines before the
abort::

    CUDA error: out of memory
      current device: 1, in function ggml_backend_cuda_graph_compute at …/ggml-cuda.cu:…

It says no size: :class:`OomReader` gives it as 0 bytes on that device, the size the
caller then takes from what the device had free (as for the kernel's oom-kill). An
``id`` of -1 (cudaGetDevice failed too) names no device.
Pure; bounded (digits, line length; the reader keeps one flag).
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from .footprint import engine_gpu, visible_of
from .policy import HOST

__all__ = ["OomReader", "asked", "visible_of"]

MAX_LINE = 2000
_CUDA = re.compile(r"allocating (\d{1,12}(?:\.\d{1,6})?) MiB on device (\d{1,3}): "
                   r"cudaMalloc failed")
_BUFFER = re.compile(r"failed to allocate ([A-Za-z_]{1,20}\d{0,3}) buffer of size "
                     r"(\d{1,20})\b")
_CPU = re.compile(r"cpu_buffer_type_alloc_buffer: failed to allocate buffer of size "
                  r"(\d{1,20})\b")


_COMPUTE_OOM = re.compile(r"(?:CUDA|ROCm|MUSA) error: out of memory")
_CURRENT = re.compile(r"current device: (-?\d{1,3}), in function ")


def asked(line: str, visible: Sequence[str] = ()) -> tuple[str, int] | None:
    """(device, bytes) of an allocation the line says failed, or None."""
    if "failed" not in line:
        return None
    line = line[:MAX_LINE]
    m = _CUDA.search(line)
    if m:
        device = engine_gpu(f"CUDA{m.group(2)}", visible)
        return (device, int(float(m.group(1)) * 2**20)) if device else None
    m = _BUFFER.search(line)
    if m:
        name = m.group(1)
        if engine_gpu(name):
            device = engine_gpu(name, visible)
            return (device, int(m.group(2))) if device else None
        return HOST, int(m.group(2))   # CPU, CPU_Mapped, CUDA_Host…: the host's RAM
    m = _CPU.search(line)
    if m:
        return HOST, int(m.group(1))
    return None


class OomReader:
    """One engine start's lines → the allocations that failed: :func:`asked`'s, and the
    compute-time report of two lines (see the module docstring) as (device, 0)."""

    def __init__(self) -> None:
        self.reported = ""   # the backend whose "error: out of memory" line came last

    def feed(self, line: str, visible: Sequence[str] = ()) -> tuple[str, int] | None:
        """What ``line`` says failed, or None."""
        line = line[:MAX_LINE]
        if self.reported:
            backend, self.reported = self.reported, ""
            m = _CURRENT.search(line)
            if m and m.group(1) != "-1":
                device = engine_gpu(f"{backend}{int(m.group(1))}", visible)
                return (device, 0) if device else None
        if "error: out of memory" in line:
            m = _COMPUTE_OOM.search(line)
            if m:
                self.reported = m.group(0).split()[0]
                return None
        return asked(line, visible)
