"""The systemd runner's held_memory reads its unit's memory.stat by lokid.host.cgroupmem:
only a path inside the cgroup tree, at most MAX_BYTES, None on any fault (issue 44, item
11). Under a real systemd: tests/dbus/test_daemon_systemd.py."""

from __future__ import annotations

from pathlib import Path

from lokid.host.cgroupmem import MAX_BYTES, read_memory_stat


def test_the_units_memory_stat_and_only_inside_the_tree(tmp_path: Path) -> None:
    root = tmp_path / "cgroup"
    unit = root / "system.slice" / "system-loki\\x2dengine.slice" / "loki-engine@p.service"
    unit.mkdir(parents=True)
    (unit / "memory.stat").write_text("anon 1\nfile 2\n")
    (tmp_path / "memory.stat").write_text("anon 9\nfile 9\n")   # outside the tree
    group = "/system.slice/system-loki\\x2dengine.slice/loki-engine@p.service"
    assert read_memory_stat(group, str(root)) == "anon 1\nfile 2\n"
    for bad in ("", "system.slice", "/..", "/system.slice/../..", "/./x"):
        assert read_memory_stat(bad, str(root)) is None, bad
    assert read_memory_stat("/absent.service", str(root)) is None
    (unit / "memory.stat").write_text("x" * (3 * MAX_BYTES))
    assert len(read_memory_stat(group, str(root)) or "") == MAX_BYTES
