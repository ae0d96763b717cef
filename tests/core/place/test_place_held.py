"""lokid.core.place.held: what an engine holds, from its cgroup's memory.stat (issue 44,
item 11).

The texts are not recordings: this machine's memory controller is on cgroup v1, and the
container's cgroup2 has none (tests/dbus/test_daemon_systemd.py reads a real unit's
memory.stat where the controller is there, and skips here). They are written in the
format and field order of Linux 6.1's memory.stat (mm/memcontrol.c, memory_stat_format;
Documentation/admin-guide/cgroup-v2.rst), with the figures of the cases they stand for.
"""

from __future__ import annotations

from lokid.core.place.held import MAX_CHARS, held_bytes, parse_stat

MiB = 2**20
GiB = 2**30


def stat(anon: int, file: int, kernel: int | None, shmem: int, file_mapped: int,
         sock: int = 0) -> str:
    """A memory.stat of Linux 6.1's shape with these figures (bytes); ``kernel`` None: a
    kernel before 5.18, which shows the parts only (here one MiB each)."""
    rows = [("anon", anon), ("file", file)]
    rows += [("kernel", kernel)] if kernel is not None else []
    rows += [("kernel_stack", MiB), ("pagetables", MiB), ("sec_pagetables", 0),
             ("percpu", MiB), ("sock", sock), ("vmalloc", 0), ("shmem", shmem),
             ("zswap", 0), ("zswapped", 0), ("file_mapped", file_mapped),
             ("file_dirty", 0), ("file_writeback", 0), ("swapcached", 0),
             ("anon_thp", 0), ("file_thp", 0), ("shmem_thp", 0),
             ("inactive_anon", anon // 2), ("active_anon", anon - anon // 2),
             ("inactive_file", file // 2), ("active_file", file - file // 2),
             ("unevictable", 0), ("slab_reclaimable", MiB), ("slab_unreclaimable", MiB),
             ("slab", 2 * MiB), ("workingset_refault_anon", 0), ("pgfault", 123456),
             ("thp_fault_alloc", 0)]
    return "".join(f"{k} {v}\n" for k, v in rows)


def test_a_fully_offloaded_engine_holds_its_own_memory_not_the_models_page_cache() -> None:
    # a 40 GiB model read once and copied to the GPU: 40 GiB of page cache, 1 GiB of it
    # still mapped (the token embeddings stay on the CPU), 3 GiB its own (CUDA_Host, context)
    text = stat(anon=3 * GiB, file=40 * GiB, kernel=60 * MiB, shmem=2 * MiB,
                file_mapped=GiB, sock=MiB)
    assert held_bytes(text) == 3 * GiB + 60 * MiB + MiB + 2 * MiB + GiB


def test_an_engine_on_the_cpu_with_mmap_holds_the_weights_it_maps() -> None:
    # the same 40 GiB read by a CPU engine that maps it whole: dropping those pages is
    # thrashing, so they count
    text = stat(anon=2 * GiB, file=40 * GiB, kernel=80 * MiB, shmem=0, file_mapped=40 * GiB)
    assert held_bytes(text) == 2 * GiB + 80 * MiB + 40 * GiB


def test_a_kernel_before_5_18_is_summed_from_its_parts() -> None:
    text = stat(anon=GiB, file=10 * GiB, kernel=None, shmem=0, file_mapped=0)
    assert held_bytes(text) == GiB + 5 * MiB   # stack, page tables, percpu, slab (2)


def test_mapped_shmem_is_never_more_than_the_file_pages() -> None:
    # file_mapped counts mapped shmem too; no figure exceeds the file pages there are
    text = stat(anon=0, file=100 * MiB, kernel=0, shmem=80 * MiB, file_mapped=90 * MiB)
    assert held_bytes(text) == 100 * MiB


def test_what_is_no_memory_stat_is_none_and_nothing_raises() -> None:
    assert held_bytes("") is None
    assert held_bytes("cache 1\nrss 2\nmapped_file 3\n") is None     # cgroup v1's names
    assert held_bytes("anon 1\n") is None
    assert held_bytes("anon x\nfile 2\n") is None
    assert held_bytes("anon 1\nfile 2\nshmem " + "9" * 5000 + "\nbad line here\n") == 1
    assert held_bytes("anon ١٢\nfile 2\n") is None   # digits of another script
    # bounded: only the first MAX_CHARS are read
    assert parse_stat("x 1\n" * MAX_CHARS + "anon 5\n") == {"x": 1}
