"""lokid.host.cores: physical cores from the kernel's CPU topology (issue 47, the
scaling rule's compute). A sysfs tree written by the test in the kernel's own format
(``thread_siblings_list``: ``0-1`` or ``0,16`` for a core's two hyperthreads), over this
process's real affinity."""

from __future__ import annotations

import os
from pathlib import Path

from lokid.host.cores import physical_cores


def tree(root: Path, siblings: dict[int, str]) -> Path:
    for cpu, text in siblings.items():
        topo = root / f"cpu{cpu}" / "topology"
        topo.mkdir(parents=True)
        (topo / "thread_siblings_list").write_text(text + "\n")
    return root


def test_hyperthreads_of_one_core_count_once(tmp_path: Path) -> None:
    cpus = sorted(os.sched_getaffinity(0))
    # every CPU of the affinity a sibling of every other: one core
    whole = ",".join(map(str, cpus))
    assert physical_cores(tree(tmp_path / "one", {c: whole for c in cpus})) == 1
    # each CPU its own core
    assert physical_cores(tree(tmp_path / "own", {c: str(c) for c in cpus})) == len(cpus)


def test_a_cpu_whose_topology_cannot_be_read_is_a_core_of_its_own(tmp_path: Path) -> None:
    cpus = sorted(os.sched_getaffinity(0))
    assert physical_cores(tmp_path / "empty") == len(cpus)
    # and the real host's tree reads as many cores as lscpu's cores per socket at most
    assert 1 <= physical_cores() <= len(cpus)
