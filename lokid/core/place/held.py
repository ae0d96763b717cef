"""What an engine holds in the host's memory, from its cgroup's ``memory.stat`` (issue 44,
item 11): the host figure of a footprint measured under systemd.

The unit's ``MemoryCurrent`` (the cgroup's ``memory.current``) counts the page cache of
every file its processes read, and a GPU engine reads its whole model file once: a fully
offloaded 40 GB model "held" 40 GB of RAM, and placement then found no room for it on a
host whose RAM it barely touches. The kernel reclaims that cache whenever memory is
wanted; it is not the engine's. So the engine's figure is the sum of what cannot be
taken from it without harm, from the fields of the kernel's cgroup v2 documentation
(Documentation/admin-guide/cgroup-v2.rst, "memory.stat"):

- ``anon``: its own memory (the weights it copied, KV cache, pinned ``CUDA_Host``
  buffers, the CUDA context's host side); all of it, active or not;
- ``kernel`` (page tables, slab, kernel stacks, percpu, vmalloc); where the kernel does
  not show that sum (before Linux 5.18), its parts: ``kernel_stack``, ``pagetables``,
  ``sec_pagetables``, ``percpu``, ``slab``, ``vmalloc``; and ``sock`` (socket buffers);
- ``shmem`` (tmpfs, shared memory): page cache that cannot be dropped;
- the page cache it *maps*, at most ``file`` minus ``shmem``: ``file_mapped``. An engine
  on the CPU (or partly offloaded) with mmap (llama.cpp's default) reads its weights
  from mapped file pages at every token: dropping them is thrashing, so they count; a
  fully offloaded engine unmaps what it copied to the GPU (llama.cpp's loader unmaps
  the fragments no CPU buffer uses), and its figure falls to what stays on the CPU
  (the token embeddings). ``file_mapped`` counts mapped shmem too: that part may be
  counted twice, which errs towards a larger figure (a little room left unused, never
  an engine placed where it does not fit).

Left out: the rest of ``file``, the cache of files read and not mapped (the model's
pages after the copy, logs). Pure: the text is given; :func:`held_bytes` never raises,
and reads at most :data:`MAX_CHARS` of it, a value at most :data:`MAX_DIGITS` digits.
"""

from __future__ import annotations

MAX_CHARS = 16384   # a real memory.stat is ~1.5 KB
MAX_DIGITS = 20     # 2**64 has 20 digits
# The parts of ``kernel``, for kernels that do not show their sum.
KERNEL_PARTS = ("kernel_stack", "pagetables", "sec_pagetables", "percpu", "slab", "vmalloc")


def parse_stat(text: str) -> dict[str, int]:
    """``memory.stat``'s "name value" lines (bytes); malformed lines are skipped."""
    out: dict[str, int] = {}
    for line in text[:MAX_CHARS].splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[1].isdigit() and len(parts[1]) <= MAX_DIGITS \
                and parts[1].isascii():
            out[parts[0]] = int(parts[1])
    return out


def held_bytes(text: str) -> int | None:
    """What the cgroup's processes hold (see the module's docstring), in bytes; None when
    ``text`` is no cgroup v2 ``memory.stat`` (no ``anon`` or no ``file``)."""
    stat = parse_stat(text)
    if "anon" not in stat or "file" not in stat:
        return None
    kernel = stat["kernel"] if "kernel" in stat else sum(stat.get(k, 0) for k in KERNEL_PARTS)
    shmem = min(stat.get("shmem", 0), stat["file"])
    mapped = min(stat.get("file_mapped", 0), stat["file"] - shmem)
    return stat["anon"] + kernel + stat.get("sock", 0) + shmem + mapped
