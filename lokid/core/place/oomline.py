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
variable's indices) maps it back. Host buffers (``CPU``, ``CUDA_Host``…) are the host's.
Pure; bounded (digits, line length).
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from .footprint import gpu_of_device
from .policy import HOST

MAX_LINE = 2000
_CUDA = re.compile(r"allocating (\d{1,12}(?:\.\d{1,6})?) MiB on device (\d{1,3}): "
                   r"cudaMalloc failed")
_BUFFER = re.compile(r"failed to allocate ([A-Za-z_]{1,20}\d{0,3}) buffer of size "
                     r"(\d{1,20})\b")
_CPU = re.compile(r"cpu_buffer_type_alloc_buffer: failed to allocate buffer of size "
                  r"(\d{1,20})\b")


def _gpu(index: int, visible: Sequence[str]) -> str:
    if visible:
        if index >= len(visible) or not visible[index].isdigit():
            return ""   # by UUID, or out of range: which GPU is not known
        index = int(visible[index])
    return f"GPU{index}"


def asked(line: str, visible: Sequence[str] = ()) -> tuple[str, int] | None:
    """(device, bytes) of an allocation the line says failed, or None."""
    if "failed" not in line:
        return None
    line = line[:MAX_LINE]
    m = _CUDA.search(line)
    if m:
        device = _gpu(int(m.group(2)), visible)
        return (device, int(float(m.group(1)) * 2**20)) if device else None
    m = _BUFFER.search(line)
    if m:
        name = m.group(1)
        gpu = gpu_of_device(name)
        if gpu:
            device = _gpu(int(gpu[3:]), visible)
            return (device, int(m.group(2))) if device else None
        return HOST, int(m.group(2))   # CPU, CPU_Mapped, CUDA_Host…: the host's RAM
    m = _CPU.search(line)
    if m:
        return HOST, int(m.group(1))
    return None


def visible_of(env_value: str | None) -> tuple[str, ...]:
    """CUDA_VISIBLE_DEVICES as a sequence of its items (() when unset)."""
    if not env_value:
        return ()
    return tuple(s.strip() for s in env_value.split(",") if s.strip())
